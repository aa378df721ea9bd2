package fencerueidis_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// TestParkingEndsWithClosedClient: a give-back parked against a server
// that was stopped (an Acquire given up on while it hung, then the server
// killed) ends once the rueidis client is closed, not at the give-back's
// deadline (a minute here), and the Locker's calls fail with
// fence.ErrClosed at once.
//
// It failed before the adapter read the client's closed state: rueidis
// (v1.0.79, v1.0.80) answers the calls of a client closed after a failed
// dial with that dial's error (ECONNREFUSED, transient), not ErrClosing,
// and the next call finds the closed connection "broken", puts it back to
// be dialed, and dials again: the parking kept dialing the stopped server
// for the minute (a fresh-clone CI run found such a goroutine in
// fencerueidis's TestMain leak check, TestObserverAndLogs's "doomed"
// give-back), and an Acquire with a wait budget waited it out.
func TestParkingEndsWithClosedClient(t *testing.T) {
	for _, tc := range []struct {
		what string
		opt  rueidis.ClientOption
	}{
		{"default", rueidis.ClientOption{}},
		{"DisableAutoPipelining", rueidis.ClientOption{DisableAutoPipelining: true}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			srv := redistest.Start(t)
			var d dialCounter
			o := tc.opt
			o.InitAddress, o.DialCtxFn = []string{srv.Addr}, d.dial
			c, err := rueidis.NewClient(o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			l := newLocker(t, c, redislock.Options{})
			srv.Pause(t)
			dctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			_, err = l.Acquire(dctx, "parked", fence.TTL(time.Minute))
			cancel()
			if err == nil {
				t.Fatal("Acquire on a stopped server succeeded")
			}
			srv.Kill() // the give-back under way fails, and is parked
			waitFor(t, func() bool { return parking(l) && d.failed.Load() >= 2 })

			c.Close()
			start := time.Now()
			_, err = l.Acquire(ctx(t), "after-close", fence.Wait(10*time.Second), fence.TTL(time.Minute))
			if took := time.Since(start); !errors.Is(err, fence.ErrClosed) || took > 2*time.Second {
				t.Errorf("Acquire on the closed client: %v after %v, want fence.ErrClosed at once", err, took)
			}
			awaitNoParkingWithin(t, 5*time.Second, "after the client was closed (the give-back's deadline is a minute away)", l)
		})
	}
}

// parking reports whether l's parking goroutine runs.
func parking(l *redislock.Locker) bool {
	buf := make([]byte, 8<<20)
	n := runtime.Stack(buf, true)
	return regexp.MustCompile(fmt.Sprintf(`redislock\.\(\*parking\)\.unpark\(0x[0-9a-f]+, %p\)`, l)).Match(buf[:n])
}
