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

// TestHungServerClientOptions: TestHungServer's calls on clients made with
// the options a user may turn on (AlwaysPipelining, DisableAutoPipelining,
// a tiny ConnWriteTimeout, RESP2, a blocking pool of two, the smallest New
// takes): every call on a stopped server ends by its caller's deadline
// with an error matching context.DeadlineExceeded or a connection error,
// and an acquisition given up on does not leave the lock held once the
// server resumes.
func TestHungServerClientOptions(t *testing.T) {
	const deadline, slack = 750 * time.Millisecond, 500 * time.Millisecond
	for _, tc := range []struct {
		what string
		opt  rueidis.ClientOption
	}{
		{"AlwaysPipelining", rueidis.ClientOption{AlwaysPipelining: true}},
		{"DisableAutoPipelining", rueidis.ClientOption{DisableAutoPipelining: true}},
		{"ConnWriteTimeout=100ms", rueidis.ClientOption{ConnWriteTimeout: 100 * time.Millisecond}},
		{"RESP2", rueidis.ClientOption{AlwaysRESP2: true, DisableCache: true}},
		{"BlockingPoolSize=2", rueidis.ClientOption{BlockingPoolSize: 2}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			srv := redistest.Start(t)
			o := tc.opt
			o.InitAddress = []string{srv.Addr}
			c, err := rueidis.NewClient(o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			var lockers []*redislock.Locker
			for _, sync := range []redislock.ReplicaSync{{Disabled: true}, {Replicas: 1, Timeout: 200 * time.Millisecond}} {
				l := newLocker(t, c, redislock.Options{ReplicaSync: sync})
				lockers = append(lockers, l)
				held, err := l.Acquire(ctx(t), "held", fence.TTL(time.Minute))
				if sync.Replicas > 0 {
					if !errors.Is(err, fence.ErrNotReplicated) {
						t.Fatalf("Acquire with a replica expected and none there = %v", err)
					}
					held = nil
				} else if err != nil {
					t.Fatal(err)
				}
				resume := srv.Pause(t)
				within := func(what string, call func(ctx context.Context) error) {
					t.Helper()
					dctx, cancel := context.WithTimeout(context.Background(), deadline)
					defer cancel()
					start := time.Now()
					err := call(dctx)
					took := time.Since(start)
					if took > deadline+slack {
						t.Errorf("%s took %v with a %v deadline (%v)", what, took, deadline, err)
					}
					if err == nil {
						t.Errorf("%s succeeded on a stopped server", what)
					}
				}
				for _, wait := range []time.Duration{0, 10 * time.Second} {
					within("Acquire", func(ctx context.Context) error {
						_, err := l.Acquire(ctx, "lock:payment:1001", fence.Wait(wait), fence.TTL(time.Minute))
						return err
					})
				}
				if held != nil {
					within("Extend", func(ctx context.Context) error { return held.Extend(ctx, time.Minute) })
					within("Release", func(ctx context.Context) error { return held.Release(ctx) })
				}
				within("Status", func(ctx context.Context) error { _, err := l.Status(ctx, "held"); return err })
				resume()
				awaitGone(t, srv.Client(t), "lock:payment:1001", 10*time.Second, "an acquisition given up on")
				if held != nil {
					if err := held.Release(ctx(t)); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
						t.Fatalf("Release after the server resumed: %v", err)
					}
					awaitGone(t, srv.Client(t), "held", 10*time.Second, "the released lock")
				}
			}
			// The give-backs parked while the server was stopped go
			// through now that it answers, before the client is closed
			// (closed, it would drop them: TestParkingEndsWithClosedClient).
			awaitNoParking(t, lockers...)
		})
	}
}

// awaitNoParking waits until none of ls has a parked give-back left (its
// goroutine, redislock's (*parking).unpark(p, l), has ended), failing the
// test after 10 s. Other tests' Lockers may run in parallel: the frames
// are matched by the Locker's address.
func awaitNoParking(t *testing.T, ls ...*redislock.Locker) {
	t.Helper()
	awaitNoParkingWithin(t, 10*time.Second, "after the server answered again", ls...)
}

// awaitNoParkingWithin is awaitNoParking with the time it waits, and what it
// waited for in the failure.
func awaitNoParkingWithin(t *testing.T, within time.Duration, after string, ls ...*redislock.Locker) {
	t.Helper()
	deadline := time.Now().Add(within)
	buf := make([]byte, 8<<20)
	for {
		n := runtime.Stack(buf, true)
		parked := false
		for _, l := range ls {
			re := regexp.MustCompile(fmt.Sprintf(`redislock\.\(\*parking\)\.unpark\(0x[0-9a-f]+, %p\)`, l))
			parked = parked || re.Match(buf[:n])
		}
		if !parked {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("parked give-backs still retried %v %s", within, after)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}
