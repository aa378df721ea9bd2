package fencetest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// reports runs the report-count subtests: each way a lease ends must be
// reported to the Observer exactly once, with a cause that agrees with
// what the lease's methods returned, and only for a lease that an Acquire
// returned. Backends record a lease's end at once and
// report it later (once they hold nothing the callback may wait for): a
// path that records the end but never makes its report, or makes it
// twice, fails here.
func (s suite) reports(t *testing.T) {
	if s.cfg.NewObserved == nil {
		t.Skip("no NewObserved")
	}
	t.Run("Released", s.reportReleased)
	t.Run("ReleasedWithDoneContext", s.reportReleasedDone)
	t.Run("ReleasedWhileExtended", s.reportReleasedExtended)
	t.Run("ExpiredUnwatched", s.reportExpired)
	t.Run("ExpiredThenReleased", s.reportExpiredReleased)
	t.Run("LostWhileRenewed", s.reportLostRenewed)
	t.Run("ExtendFindsLost", s.reportExtendLost)
	t.Run("ReleaseRacesRemove", s.reportReleaseRace)
	t.Run("ShortLease", s.reportShort)
	t.Run("AcquireDonePanics", s.reportPanics)
}

// panicker is an Observer whose AcquireDone panics for the first lease it
// is told of once armed (NewObserved may acquire, to warm up).
type panicker struct {
	fence.NopObserver
	armed atomic.Bool
}

func (p *panicker) AcquireDone(ev fence.AcquireEvent) {
	if ev.Result == fence.Acquired && p.armed.Swap(false) {
		panic("fencetest: AcquireDone panics")
	}
}

// reportPanics: an Observer whose AcquireDone panics makes Acquire panic
// with the lock taken and no lease returned; a caller that recovers must
// not be left with a lock held by no one (a watchdog's, for ever):
// fence.ReportAcquire releases it.
func (s suite) reportPanics(t *testing.T) {
	p := &panicker{}
	l := s.cfg.NewObserved(t, p)
	n := name(t)
	p.armed.Store(true)
	var r any
	var err error
	// A lease given back for a late reply (see mustAcquire) is reported
	// Failed, which does not panic: tried again.
	for try := 1; r == nil && try <= 5; try++ {
		r = func() (r any) {
			defer func() { r = recover() }()
			_, err = l.Acquire(ctxFor(t), n)
			return nil
		}()
		if !errors.Is(err, fence.ErrLeaseLost) {
			break
		}
	}
	if r == nil {
		t.Fatalf("Acquire did not panic with its Observer (it returned %v)", err)
	}
	// On the same Locker: New's may not share NewObserved's locks (memlock).
	next, err := l.Acquire(ctxFor(t), n, fence.Wait(s.cfg.Slack), fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("the lock taken by the Acquire whose Observer panicked is not free %v later: %v", s.cfg.Slack, err)
	}
	mustRelease(t, next)
}

// counter is an Observer that records the acquisitions and ends of leases
// in the order it was told of them.
type counter struct {
	fence.NopObserver
	mu       sync.Mutex
	acquired map[string]bool               // name/token of each granted lease
	ended    map[string][]fence.LeaseEvent // by name/token
	early    []string                      // ends told before their acquisition
}

func newCounter() *counter {
	return &counter{acquired: map[string]bool{}, ended: map[string][]fence.LeaseEvent{}}
}

func leaseKey(name string, tok fence.Token) string { return fmt.Sprintf("%s/%d", name, tok) }

func (c *counter) AcquireDone(ev fence.AcquireEvent) {
	if ev.Result != fence.Acquired {
		return
	}
	c.mu.Lock()
	c.acquired[leaseKey(ev.Name, ev.Token)] = true
	c.mu.Unlock()
}

func (c *counter) LeaseEnded(ev fence.LeaseEvent) {
	k := leaseKey(ev.Name, ev.Token)
	c.mu.Lock()
	if !c.acquired[k] {
		c.early = append(c.early, k)
	}
	c.ended[k] = append(c.ended[k], ev)
	c.mu.Unlock()
}

// endsOf returns the ends reported for lease so far.
func (c *counter) endsOf(lease fence.Lease, name string) []fence.LeaseEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]fence.LeaseEvent(nil), c.ended[leaseKey(name, lease.Token())]...)
}

// await waits up to limit for lease's end to be reported, and returns the
// report; it fails the test if none came.
func (c *counter) await(t *testing.T, lease fence.Lease, name string, limit time.Duration) fence.LeaseEvent {
	t.Helper()
	end := time.Now().Add(limit)
	for {
		if evs := c.endsOf(lease, name); len(evs) > 0 {
			return evs[0]
		}
		if time.Now().After(end) {
			fatalStacks(t, fmt.Sprintf("the end of lease %q token %d was not reported within %v (Err() = %v)",
				name, lease.Token(), limit, lease.Err()))
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// observed returns a Locker with a counter as its Observer. Once the test
// and its clean-ups (the Locker's Close among them) are done, every lease
// the counter saw granted must have been reported ended exactly once, and
// no other.
func (s suite) observed(t *testing.T) (fence.Locker, *counter) {
	return s.observedVia(t, func(c *counter) fence.Observer { return c })
}

// observedVia is observed with the Observer that via makes of the counter
// (one that counts through it).
func (s suite) observedVia(t *testing.T, via func(*counter) fence.Observer) (fence.Locker, *counter) {
	c := newCounter()
	// Registered before NewObserved's clean-ups, so run after them.
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for k := range c.acquired {
			if n := len(c.ended[k]); n != 1 {
				t.Errorf("lease %s: %d reports of its end, want 1: %+v", k, n, c.ended[k])
			}
		}
		for k, evs := range c.ended {
			if !c.acquired[k] {
				t.Errorf("lease %s: end reported (%+v) but no acquisition", k, evs)
			}
		}
		if len(c.early) > 0 {
			// Not a failure: backends report the acquisition as Acquire
			// returns, after the lease's timers started, so a lease that
			// ends at once (fence.MinTTL on a stalled machine) may be
			// reported ended first (see fence.Observer).
			t.Logf("ends reported before their lease's acquisition: %v", c.early)
		}
	})
	return s.cfg.NewObserved(t, via(c)), c
}

// wantOne checks that exactly one end of lease was reported.
func wantOne(t *testing.T, c *counter, lease fence.Lease, name string) {
	t.Helper()
	if evs := c.endsOf(lease, name); len(evs) != 1 {
		t.Errorf("%d reports of the lease's end, want 1: %+v", len(evs), evs)
	}
}

func wantLoss(t *testing.T, ev fence.LeaseEvent) {
	t.Helper()
	if ev.Cause == fence.Released || !errors.Is(ev.Err, fence.ErrLeaseLost) {
		t.Errorf("reported cause %q, Err %v; want a loss matching ErrLeaseLost", ev.Cause, ev.Err)
	}
}

func (s suite) reportReleased(t *testing.T) {
	l, c := s.observed(t)
	n := name(t)
	lease := s.mustAcquire(t, l, n)
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release = %v", err)
	}
	// Release reports the end before it returns (on its goroutine, once
	// it let go of what a callback's Release waits for).
	if evs := c.endsOf(lease, n); len(evs) != 1 || evs[0].Cause != fence.Released || !errors.Is(evs[0].Err, fence.ErrReleased) {
		t.Fatalf("reports once Release returned nil: %+v; want one, Released", evs)
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("second Release = %v", err)
	}
	wantOne(t, c, lease, n)
}

// reportReleasedExtended: Release reports the end it settles before it
// returns, even while Extends of the lease run on another goroutine: an
// Extend's clean-up that took the report and made it, later, on its own
// goroutine (pglock and etcdlock before 8f76f84) would let Release return
// with the end unreported. The Observer calls the lease back (Release,
// Extend) before it counts the end, which widens that window to a few
// round trips. Fixed and watchdog leases alike.
func (s suite) reportReleasedExtended(t *testing.T) {
	cb := &callingBack{leases: map[string]fence.Lease{}}
	l, c := s.observedVia(t, func(c *counter) fence.Observer { cb.counter = c; return cb })
	ctx := ctxFor(t)
	for i := range 30 {
		n := fmt.Sprintf("%s:%d", name(t), i)
		var opts []fence.Option
		if i%2 == 0 {
			opts = append(opts, fence.TTL(time.Minute))
		}
		lease := s.mustAcquire(t, l, n, opts...)
		cb.set(n, lease)
		stop := make(chan struct{})
		var extending sync.WaitGroup
		extending.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if lease.Extend(ctx, time.Minute) != nil {
					return
				}
			}
		})
		if err := lease.Extend(ctx, time.Minute); err != nil { // one in flight beside it, likely
			t.Fatalf("lease %d: Extend = %v", i, err)
		}
		err := lease.Release(ctx)
		evs := c.endsOf(lease, n)
		close(stop)
		extending.Wait()
		if err != nil {
			t.Fatalf("lease %d: Release = %v", i, err)
		}
		if len(evs) != 1 || evs[0].Cause != fence.Released {
			t.Fatalf("lease %d: reports once Release returned nil, with Extends running: %+v; want one, Released", i, evs)
		}
	}
}

// callingBack is an Observer that calls the lease of an end back (Release,
// then Extend) before it counts the end.
type callingBack struct {
	*counter
	mu     sync.Mutex
	leases map[string]fence.Lease // by name
}

func (o *callingBack) set(name string, lease fence.Lease) {
	o.mu.Lock()
	o.leases[name] = lease
	o.mu.Unlock()
}

func (o *callingBack) LeaseEnded(ev fence.LeaseEvent) {
	o.mu.Lock()
	lease := o.leases[ev.Name]
	o.mu.Unlock()
	if lease != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = lease.Release(ctx)
		_ = lease.Extend(ctx, time.Minute)
		cancel()
	}
	o.counter.LeaseEnded(ev)
}

// reportReleasedDone: Release with a context already done, on a lease of
// a fixed TTL; whatever Release concluded, the end is reported, by the
// latest when the lease time runs out.
func (s suite) reportReleasedDone(t *testing.T) {
	l, c := s.observed(t)
	n := name(t)
	const ttl = 500 * time.Millisecond
	lease := s.mustAcquire(t, l, n, fence.TTL(ttl))
	done, cancel := context.WithCancel(context.Background())
	cancel()
	relErr := lease.Release(done)
	ev := c.await(t, lease, n, ttl+10*time.Second)
	if relErr == nil && ev.Cause != fence.Released {
		t.Errorf("Release = nil but the end was reported as %q (%v)", ev.Cause, ev.Err)
	}
	if err := lease.Release(ctxFor(t)); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release again = %v", err)
	}
	wantOne(t, c, lease, n)
}

// reportExpired: a lease of a fixed TTL runs out while nobody calls any of
// its methods: its expiry must still be reported.
func (s suite) reportExpired(t *testing.T) {
	l, c := s.observed(t)
	n := name(t)
	lease := s.mustAcquire(t, l, n, fence.TTL(200*time.Millisecond))
	ev := c.await(t, lease, n, 10*time.Second)
	wantLoss(t, ev)
	wantOne(t, c, lease, n)
}

func (s suite) reportExpiredReleased(t *testing.T) {
	l, c := s.observed(t)
	n := name(t)
	lease := s.mustAcquire(t, l, n, fence.TTL(200*time.Millisecond))
	<-lease.Done()
	ev := c.await(t, lease, n, 10*time.Second)
	wantLoss(t, ev)
	if err := lease.Release(ctxFor(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release of the expired lease = %v, want ErrLeaseLost", err)
	}
	if err := lease.Extend(ctxFor(t), time.Second); err == nil {
		t.Errorf("Extend of the expired lease = nil")
	}
	wantOne(t, c, lease, n)
}

func (s suite) reportLostRenewed(t *testing.T) {
	l, c := s.observed(t)
	n := name(t)
	lease := s.mustAcquire(t, l, n)
	s.cfg.Remove(t, n)
	ev := c.await(t, lease, n, 10*s.cfg.WatchdogTTL+10*time.Second)
	wantLoss(t, ev)
	if err := lease.Release(ctxFor(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release of the lost lease = %v, want ErrLeaseLost", err)
	}
	wantOne(t, c, lease, n)
}

func (s suite) reportExtendLost(t *testing.T) {
	l, c := s.observed(t)
	n := name(t)
	lease := s.mustAcquire(t, l, n, fence.TTL(10*time.Second))
	s.cfg.Remove(t, n)
	if err := lease.Extend(ctxFor(t), 10*time.Second); !errors.Is(err, fence.ErrLeaseLost) {
		// A session's watch may not have seen it yet (zklock): then the
		// lease ends within the session bound.
		if s.cfg.SessionBound == 0 {
			t.Errorf("Extend after Remove = %v, want ErrLeaseLost", err)
		}
	}
	ev := c.await(t, lease, n, 10*time.Second+s.cfg.SessionBound)
	wantLoss(t, ev)
	if err := lease.Release(ctxFor(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release of the lost lease = %v, want ErrLeaseLost", err)
	}
	wantOne(t, c, lease, n)
}

// reportReleaseRace: Release and a removal of the lock race; one end is
// reported, and its cause agrees with Release's result: Released when it
// returned nil, a loss when it returned ErrLeaseLost.
func (s suite) reportReleaseRace(t *testing.T) {
	l, c := s.observed(t)
	for i := range 10 {
		n := fmt.Sprintf("%s:%d", name(t), i)
		lease := s.mustAcquire(t, l, n)
		removed := make(chan struct{})
		// Remove may find the lock released already: a failure of its
		// is no failure of the test.
		go func() { defer close(removed); s.cfg.Remove(tolerant{TB: t}, n) }()
		relErr := lease.Release(ctxFor(t))
		<-removed
		ev := c.await(t, lease, n, 10*s.cfg.WatchdogTTL+10*time.Second)
		switch {
		case relErr == nil && ev.Cause != fence.Released:
			t.Errorf("%d: Release = nil, but the end was reported as %q (%v)", i, ev.Cause, ev.Err)
		case errors.Is(relErr, fence.ErrLeaseLost) && ev.Cause == fence.Released:
			t.Errorf("%d: Release = %v, but the end was reported as %q", i, relErr, ev.Cause)
		case relErr != nil && !errors.Is(relErr, fence.ErrLeaseLost):
			t.Errorf("%d: Release = %v, want nil or ErrLeaseLost", i, relErr)
		}
		if err := lease.Release(ctxFor(t)); (err == nil) != (relErr == nil) {
			t.Errorf("%d: Release again = %v, first %v", i, err, relErr)
		}
		wantOne(t, c, lease, n)
	}
}

// tolerant is a testing.TB whose failures are logged, not failures of
// the test; a Fatal ends the calling goroutine (one of the test's own).
type tolerant struct{ testing.TB }

func (t tolerant) Error(args ...any)                 { t.Log(args...) }
func (t tolerant) Errorf(format string, args ...any) { t.Logf(format, args...) }
func (t tolerant) Fatal(args ...any)                 { t.Log(args...); runtime.Goexit() }
func (t tolerant) Fatalf(format string, args ...any) { t.Logf(format, args...); runtime.Goexit() }

// reportShort: a lease of fence.MinTTL may end as Acquire returns; its end
// is reported once.
func (s suite) reportShort(t *testing.T) {
	l, c := s.observed(t)
	for i := range 20 {
		n := fmt.Sprintf("%s:%d", name(t), i)
		lease, err := l.Acquire(ctxFor(t), n, fence.TTL(fence.MinTTL))
		if err != nil {
			if s.cfg.ShortLeaseMayFail && errors.Is(err, fence.ErrNotAcquired) {
				continue
			}
			t.Fatalf("Acquire with TTL(MinTTL): %v", err)
		}
		c.await(t, lease, n, 10*time.Second)
		if i%2 == 0 {
			_ = lease.Release(ctxFor(t))
		}
		wantOne(t, c, lease, n)
	}
}
