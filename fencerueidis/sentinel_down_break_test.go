package fencerueidis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// TestSentinelMasterStaysDown: a Sentinel client whose master dies and is
// never replaced (no replica to promote) has every call refused; the calls
// are tried again for switchWait (5 s) at most, within ctx. Each call must
// still end by its caller's deadline, and a watchdog lease at its deadline,
// not a 5 s wait later: the renewals' retries must not outlive the lease.
func TestSentinelMasterStaysDown(t *testing.T) {
	primary := redistest.Start(t)
	sentinels := redistest.StartSentinels(t, primary, 1)
	redistest.WaitSentinelsReady(t, sentinels, 0)
	d := &refusedDials{addr: primary.Addr}
	newClient := func() rueidis.Client {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: sentinels.Addrs(), DialCtxFn: d.dial,
			Sentinel: rueidis.SentinelOption{MasterSet: sentinels.Master}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	l := newLocker(t, newClient(), redislock.Options{WatchdogTTL: 1500 * time.Millisecond})
	c2 := newClient() // closed during a back-off, below
	l2 := newLocker(t, c2, redislock.Options{})
	watched, err := l.Acquire(ctx(t), "lock:down:watchdog")
	if err != nil {
		t.Fatal(err)
	}
	fixed, err := l.Acquire(ctx(t), "lock:down:fixed", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan time.Time, 1)
	go func() { <-watched.Done(); ended <- time.Now() }()
	primary.Kill()
	waitFor(t, func() bool { return d.failed.Load() >= 1 || watched.Err() != nil })

	// within reports a call's time, failing when it took more than want
	// plus a generous margin (the bug this guards against is 5 s).
	const margin = 1500 * time.Millisecond
	within := func(what string, want time.Duration, call func() error) {
		t.Helper()
		start := time.Now()
		err := call()
		took := time.Since(start)
		t.Logf("%s: %v after %v", what, err, took.Round(time.Millisecond))
		if err == nil {
			t.Errorf("%s succeeded on a dead master", what)
		}
		if took > want+margin {
			t.Errorf("%s took %v, want at most %v", what, took.Round(time.Millisecond), want)
		}
	}
	timeout := func(d time.Duration) (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), d)
	}
	within("Release(300ms)", 300*time.Millisecond, func() error {
		c, cancel := timeout(300 * time.Millisecond)
		defer cancel()
		return fixed.Release(c)
	})
	within("Acquire(300ms, try once)", 300*time.Millisecond, func() error {
		c, cancel := timeout(300 * time.Millisecond)
		defer cancel()
		_, err := l.Acquire(c, "lock:down:other")
		return err
	})
	// The first try runs on ctx alone (redislock's doc, Deadlines): a
	// caller whose only deadline is the budget gives ctx one a little
	// past it, as fence exec does.
	within("Acquire(1.7s, Wait 700ms)", 1700*time.Millisecond, func() error {
		c, cancel := timeout(1700 * time.Millisecond)
		defer cancel()
		_, err := l.Acquire(c, "lock:down:other", fence.Wait(700*time.Millisecond))
		return err
	})
	within("Status(300ms)", 300*time.Millisecond, func() error {
		c, cancel := timeout(300 * time.Millisecond)
		defer cancel()
		_, err := l.Status(c, "lock:down:other")
		return err
	})
	within("Acquire(no deadline, try once)", 5*time.Second, func() error {
		_, err := l.Acquire(context.Background(), "lock:down:other")
		return err
	})

	select {
	case at := <-ended:
		late := at.Sub(watched.Deadline())
		t.Logf("watchdog lease ended %v after its deadline: %v", late.Round(time.Millisecond), watched.Err())
		if late > margin {
			t.Errorf("watchdog lease ended %v after its deadline", late.Round(time.Millisecond))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("watchdog lease not ended 30 s after its master died")
	}

	// Close during the back-off: the call ends with fence.ErrClosed soon
	// after, not switchWait later.
	before := d.failed.Load()
	got := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := l2.Acquire(context.Background(), "lock:down:closed")
		got <- err
	}()
	waitFor(t, func() bool { return d.failed.Load() >= before+2 })
	c2.Close()
	closed := time.Now()
	select {
	case err := <-got:
		t.Logf("Acquire on a client closed during the back-off: %v, %v after Close (%v in all)", err,
			time.Since(closed).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		if !errors.Is(err, fence.ErrClosed) {
			t.Errorf("Acquire on a closed client: %v, want fence.ErrClosed", err)
		}
		if time.Since(closed) > margin {
			t.Errorf("Acquire returned %v after Close", time.Since(closed).Round(time.Millisecond))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Acquire did not return 30 s after Close")
	}
}
