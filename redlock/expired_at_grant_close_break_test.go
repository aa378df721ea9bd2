package redlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// As TestCloseOvertakingAcquireReportsNoLease, on a busy machine: the
// lease's deadline has passed when it starts (the clock runs a lease time
// behind, as in TestExpiredAtGrantIsReported), and its expiry timer, which
// start runs at once since 1f1ee96, ends it before the acquisition lists it
// for Close (the machine was busy between the two; the hook waits for the
// end there). Close overtook the acquisition: Acquire fails with ErrClosed
// (AcquireDone is told so) and the lease was never granted, but the timer
// had already made the report of its end, before Acquire marked it
// unreported. The Observer so hears of the end of a lease that no Acquire
// returned: fencetest's Reports fail such a Locker ("end reported but no
// acquisition").
func TestCloseOvertakingExpiredAtGrantReportsNoLease(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "close-overtaken-expired", time.Second
	rec := &recorder{}
	l := newLocker(t, srvs, &redlock.Options{NodeTimeout: generous, Observer: rec})
	redlock.SetClock(l, func() time.Time { return time.Now().Add(-ttl) })
	closed := make(chan error, 1)
	redlock.SetBeforeReplies(l, func() {
		redlock.SetBeforeReplies(l, nil) // not for the probes' tries
		go func() { _, err := closeWithin(l, 10*time.Second); closed <- err }()
		waitClosing(t, l, name, ttl)
	})
	redlock.SetLeaseStarted(l, func(lease fence.Lease) {
		if lease.Name() != name {
			return // a probe's
		}
		select {
		case <-lease.Done():
		case <-ctxFor(t).Done():
			t.Error("the lease, started past its deadline, did not end")
		}
	})
	if _, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl)); !errors.Is(err, redlock.ErrClosed) {
		t.Fatalf("Acquire overtaken by Close = %v, want ErrClosed", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	// The timer's report, if made, is made on the timer's goroutine just
	// after the lease ended: give it a moment to come.
	deadline := time.Now().Add(time.Second) // no event to wait on: a report not made has none; a second is watched
	for time.Now().Before(deadline) {
		rec.mu.Lock()
		for _, e := range rec.ends {
			if e.Name == name {
				rec.mu.Unlock()
				t.Fatalf("the Observer was told of the end of a lease that no Acquire granted: %+v (acquisitions seen: %v)", e, rec.acquires)
			}
		}
		rec.mu.Unlock()
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// A watchdog lease whose deadline has passed when it starts (the clock
// runs a watchdog TTL behind) ends at once, as not renewed, and its end is
// reported once: its expiry timer ends it, and neither the watchdog nor a
// Release afterwards reports it again.
func TestWatchdogExpiredAtGrantIsReportedOnce(t *testing.T) {
	srvs := nodes(t, 3)
	rec := &recorder{}
	const wd = time.Second
	l := newLocker(t, srvs, &redlock.Options{WatchdogTTL: wd, NodeTimeout: generous, Observer: rec})
	redlock.SetClock(l, func() time.Time { return time.Now().Add(-wd) })
	const name = "watchdog-expired-at-grant"
	lease, err := l.Acquire(ctxFor(t), name)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	select {
	case <-lease.Done():
	case <-ctxFor(t).Done():
		t.Fatal("the watchdog lease, granted past its deadline, did not end")
	}
	if err := lease.Release(ctxFor(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release of the lease ended at its start = %v, want ErrLeaseLost", err)
	}
	ends := func() []fence.LeaseEvent {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		var evs []fence.LeaseEvent
		for _, e := range rec.ends {
			if e.Name == name {
				evs = append(evs, e)
			}
		}
		return evs
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(ends()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	if evs := ends(); len(evs) != 1 || evs[0].Cause != fence.LostRenewFailed {
		t.Fatalf("reports of the end of a watchdog lease granted past its deadline: %+v; want one, %q", evs, fence.LostRenewFailed)
	}
}
