package fencetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// extendRacesRelease: an Extend running while its lease is released
// either renewed the lease before the Release ended it (nil) or says the
// lock is no longer this lease's (an error matching ErrLeaseLost), never
// a bare ErrReleased or a backend's error; and, either way, once Release
// has returned nil the lock is free: an Extend whose write reached the
// backend after the delete must not have taken the lock back.
func (s suite) extendRacesRelease(t *testing.T) {
	l, other := s.cfg.New(t), s.cfg.New(t)
	n := name(t)
	for round := range 20 {
		lease := s.mustAcquire(t, l, n, fence.TTL(10*time.Second))
		start := make(chan struct{})
		extended := make(chan error, 1)
		go func() {
			<-start
			extended <- lease.Extend(ctxFor(t), 20*time.Second)
		}()
		close(start)
		if round%2 == 1 {
			// Injected delay: in odd rounds the Extend's request
			// leaves a little before the Release's.
			time.Sleep(time.Duration(round) * 50 * time.Microsecond)
		}
		if err := lease.Release(ctxFor(t)); err != nil {
			t.Fatalf("round %d: Release racing Extend = %v, want nil", round, err)
		}
		var extErr error
		select {
		case extErr = <-extended:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: Extend racing Release has not returned in 30 s", round)
		}
		if extErr != nil && !errors.Is(extErr, fence.ErrLeaseLost) {
			t.Fatalf("round %d: Extend racing Release = %v, want nil or an error matching ErrLeaseLost", round, extErr)
		}
		if !errors.Is(lease.Err(), fence.ErrReleased) {
			t.Fatalf("round %d: Err() after Release = %v, want ErrReleased", round, lease.Err())
		}
		s.mustBeFree(t, other, n, fmt.Sprintf("round %d: the lock is not free after Release returned nil (Extend racing it = %v)", round, extErr))
	}
}

// closedClientLease: a lease held when its client is closed (a program
// shutting down with a lock still held) can no longer be renewed or
// released through it: Extend and Release each return an error at once,
// whatever time is left on their contexts, rather than wait for a
// connection that will never come back; the lease's deadline does not
// move.
func (s suite) closedClientLease(t *testing.T) {
	l, closeClient := s.cfg.NewClosable(t)
	// A name of its own each run: nothing can free this lock before it
	// expires.
	n := fmt.Sprintf("%s:%d", name(t), time.Now().UnixNano())
	lease := s.mustAcquire(t, l, n, fence.TTL(30*time.Second))
	deadline := lease.Deadline()
	closeClient()
	start := time.Now()
	if err := lease.Extend(ctxFor(t), time.Minute); err == nil {
		t.Fatal("Extend on a closed client = nil, want an error")
	}
	if took := time.Since(start); took > s.cfg.Slack {
		t.Errorf("Extend on a closed client took %v, want an error at once", took)
	}
	if d := lease.Deadline(); d.After(deadline) {
		t.Errorf("Extend on a closed client moved Deadline from %v to %v", deadline, d)
	}
	start = time.Now()
	if err := lease.Release(ctxFor(t)); err == nil {
		t.Error("Release on a closed client = nil, want an error: nothing could delete the lock")
	}
	if took := time.Since(start); took > s.cfg.Slack {
		t.Errorf("Release on a closed client took %v, want an error at once", took)
	}
}

// releaseRacesWatchdog: a watchdog lease released just as its watchdog
// sends its first renewal (the renewal may be on its way) leaves the lock
// free once Release has returned nil: a renewal that reached the backend
// after the delete must not have taken the lock back.
func (s suite) releaseRacesWatchdog(t *testing.T) {
	l, other := s.cfg.New(t), s.cfg.New(t)
	n := name(t)
	for round := range 3 {
		lease := s.mustAcquire(t, l, n)
		// Injected delay: every backend's watchdog sends its first
		// renewal a third of the lease time after the grant; each round
		// releases then, or up to a 300th of the lease time later. (Rounds
		// that released at 0 to 4/15 of the lease time, before any
		// renewal, passed a backend whose late renewal took the lock
		// back.)
		time.Sleep(s.cfg.WatchdogTTL/3 + time.Duration(round)*s.cfg.WatchdogTTL/600)
		if err := lease.Release(ctxFor(t)); err != nil {
			t.Fatalf("round %d: Release = %v, want nil", round, err)
		}
		s.mustBeFree(t, other, n, fmt.Sprintf("round %d: the lock is not free after Release returned nil", round))
	}
}

// cancelRacesHandoff: a waiter whose context ends as the holder releases
// (the lock may be granted to it just then) leaves no lock held for
// nobody: once its Acquire has returned an error, a third caller gets the
// lock within a second, not at the end of a lease time no one holds.
func (s suite) cancelRacesHandoff(t *testing.T) {
	l, waiter, third := s.cfg.New(t), s.cfg.New(t), s.cfg.New(t)
	n := name(t)
	for round := range 8 {
		holder := s.mustAcquire(t, l, n, fence.TTL(30*time.Second))
		wctx, cancel := context.WithCancel(ctxFor(t))
		waited := make(chan error, 1)
		go func() {
			lease, err := waiter.Acquire(wctx, n, fence.Wait(30*time.Second), fence.TTL(30*time.Second))
			if err == nil {
				err = lease.Release(ctxFor(t))
				if err == nil {
					err = errGot
				}
			}
			waited <- err
		}()
		// Injected delay: let the waiter start waiting in most rounds,
		// then cancel it about when the holder releases.
		time.Sleep(time.Duration(round) * 7 * time.Millisecond)
		go cancel()
		if err := holder.Release(ctxFor(t)); err != nil {
			t.Fatalf("round %d: Release = %v", round, err)
		}
		select {
		case err := <-waited:
			if err != errGot && !errors.Is(err, context.Canceled) {
				t.Fatalf("round %d: the cancelled waiter's Acquire = %v, want the lock or context.Canceled", round, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: the cancelled waiter's Acquire has not returned in 30 s", round)
		}
		cancel()
		start := time.Now()
		next, err := third.Acquire(ctxFor(t), n, fence.Wait(time.Second+s.cfg.Slack))
		if err != nil {
			t.Fatalf("round %d: after a waiter cancelled as the lock was released, Acquire waiting %v = %v: the lock is held for nobody", round, time.Second+s.cfg.Slack, err)
		}
		if took := time.Since(start); took > time.Second+s.cfg.Slack/2 {
			t.Errorf("round %d: the lock came free %v after a cancelled waiter returned", round, took)
		}
		mustRelease(t, next)
	}
}

// budgetEndRacesHandoff: as cancelRacesHandoff, with the waiter's wait
// budget running out as the holder releases: a grant to a waiter that has
// just stopped waiting is given back, not kept for nobody.
func (s suite) budgetEndRacesHandoff(t *testing.T) {
	l, waiter, third := s.cfg.New(t), s.cfg.New(t), s.cfg.New(t)
	n := name(t)
	const budget = 150 * time.Millisecond
	// Injected delay: the holder releases this long before the waiter's
	// budget ends (after, if negative), the rounds closest together about
	// its end: a grant whose reply comes after the budget has ended is on
	// its way for a millisecond or two, and rounds 8 ms apart passed a
	// waiter that kept such a grant, its reply 2 ms on its way.
	before := []time.Duration{24, 8, 4, 2, 1, 0, -1, -4}
	for round := range before {
		holder := s.mustAcquire(t, l, n, fence.TTL(30*time.Second))
		waited := make(chan error, 1)
		go func() {
			lease, err := waiter.Acquire(ctxFor(t), n, fence.Wait(budget), fence.TTL(30*time.Second))
			if err == nil {
				err = lease.Release(ctxFor(t))
				if err == nil {
					err = errGot
				}
			}
			waited <- err
		}()
		time.Sleep(budget - before[round]*time.Millisecond)
		if err := holder.Release(ctxFor(t)); err != nil {
			t.Fatalf("round %d: Release = %v", round, err)
		}
		select {
		case err := <-waited:
			if err != errGot && !errors.Is(err, fence.ErrHeld) {
				t.Fatalf("round %d: the waiter's Acquire = %v, want the lock or ErrHeld", round, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: the waiter's Acquire has not returned in 30 s", round)
		}
		start := time.Now()
		next, err := third.Acquire(ctxFor(t), n, fence.Wait(time.Second+s.cfg.Slack))
		if err != nil {
			t.Fatalf("round %d: after a waiter's budget ran out as the lock was released, Acquire waiting %v = %v: the lock is held for nobody", round, time.Second+s.cfg.Slack, err)
		}
		if took := time.Since(start); took > time.Second+s.cfg.Slack/2 {
			t.Errorf("round %d: the lock came free %v after the waiter returned", round, took)
		}
		mustRelease(t, next)
	}
}

var errGot = errors.New("the waiter got the lock and released it")

// extendAfterExpiry: a lease that expired cannot be brought back by
// Extend once its lock has been taken and freed again by another caller:
// its holder was told its lease ended. Extend says ErrLeaseLost, and the
// lock stays free.
func (s suite) extendAfterExpiry(t *testing.T) {
	l, other := s.cfg.New(t), s.cfg.New(t)
	n := name(t)
	lease := s.mustAcquire(t, l, n, fence.TTL(200*time.Millisecond))
	// Past the lock's expiry in the backend, not only the lease's
	// Deadline (which errs early): another caller has had it.
	mustRelease(t, s.mustAcquire(t, other, n, fence.Wait(10*time.Second)))
	waitDone(t, lease, s.cfg.Slack)
	if err := lease.Extend(ctxFor(t), time.Minute); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend of an expired lease = %v, want ErrLeaseLost", err)
	}
	s.mustBeFree(t, other, n, "after an Extend of an expired lease (the Extend took the lock back?)")
}

// releaseCancelledMidCall: a Release whose context ends while its request
// is under way may fail with ctx's error (not conclusive: the lease ended,
// the delete maybe not sent); a second Release with a live context then
// frees the lock: once it has returned nil, another caller takes it at
// once, whether or not the first delete got through.
func (s suite) releaseCancelledMidCall(t *testing.T) {
	s.cutMidCall(t, "Release", func(ctx context.Context, lease fence.Lease) error { return lease.Release(ctx) },
		func(lease fence.Lease, first error) error {
			if err := lease.Release(ctxFor(t)); err != nil {
				return fmt.Errorf("the second Release, after %v, = %v, want nil", first, err)
			}
			return nil
		})
}

// extendCancelledMidCall: an Extend whose context ends while its request
// is under way may fail with ctx's error, and the lease goes on (its
// Deadline unmoved, the lock maybe held longer in the backend); a Release
// then frees the lock at once, whatever the Extend did.
func (s suite) extendCancelledMidCall(t *testing.T) {
	s.cutMidCall(t, "Extend", func(ctx context.Context, lease fence.Lease) error { return lease.Extend(ctx, time.Minute) },
		func(lease fence.Lease, extErr error) error {
			if err := lease.Err(); err != nil {
				return fmt.Errorf("the lease ended after an Extend cancelled mid-call (%v): %v", extErr, err)
			}
			if err := lease.Release(ctxFor(t)); err != nil {
				return fmt.Errorf("the Release after an Extend cancelled mid-call (%v) = %v, want nil", extErr, err)
			}
			return nil
		})
}

// cutMidCall runs call, 12 rounds, on a fresh lease with a context
// cancelled at another point of its request each round (0 to 1.1 ms in):
// call must return nil or context.Canceled; then release must free the
// lock (an error says why not), which another caller must then take at
// once.
func (s suite) cutMidCall(t *testing.T, what string, call func(context.Context, fence.Lease) error, release func(fence.Lease, error) error) {
	l, other := s.cfg.New(t), s.cfg.New(t)
	n := name(t)
	cut := 0
	defer func() { t.Logf("%d of 12 calls of %s cut by their context", cut, what) }()
	for round := range 12 {
		lease := s.mustAcquire(t, l, n, fence.TTL(30*time.Second))
		ctx, cancel := context.WithCancel(ctxFor(t))
		// Injected delay: the cancel comes at another point of the
		// call's request each round.
		stop := time.AfterFunc(time.Duration(round)*100*time.Microsecond, cancel)
		err := call(ctx, lease)
		stop.Stop()
		cancel()
		if err != nil {
			cut++
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("round %d: %s cancelled mid-call = %v, want nil or context.Canceled", round, what, err)
			}
		}
		if rerr := release(lease, err); rerr != nil {
			t.Fatalf("round %d: %v", round, rerr)
		}
		s.mustBeFree(t, other, n, fmt.Sprintf("round %d: the lock is not free once released (the %s cut mid-call: %v)", round, what, err))
	}
}

// acquireCancelledMidCall: an Acquire of a free lock whose context ends
// while its request is under way either returns the lease or an error
// matching context.Canceled; after an error, the lock is not left held for
// nobody: another caller gets it within a second, not a lease time later
// (the take may have run, its reply lost: the backend gives it back).
func (s suite) acquireCancelledMidCall(t *testing.T) {
	l, other := s.cfg.New(t), s.cfg.New(t)
	n := name(t)
	cut := 0
	defer func() { t.Logf("%d of 12 Acquires cut by their context", cut) }()
	for round := range 12 {
		ctx, cancel := context.WithCancel(ctxFor(t))
		// Injected delay: the cancel comes at another point of the
		// Acquire's request each round.
		stop := time.AfterFunc(time.Duration(round)*150*time.Microsecond, cancel)
		lease, err := l.Acquire(ctx, n, fence.TTL(30*time.Second))
		stop.Stop()
		cancel()
		if err == nil {
			mustRelease(t, lease)
			continue
		}
		cut++
		// ErrHeld: the last round's cut take, its node or key being given
		// back (zklock in ci100), still held the lock for this try.
		if !errors.Is(err, context.Canceled) && !errors.Is(err, fence.ErrHeld) || !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("round %d: Acquire cancelled mid-call = %v, want ErrNotAcquired and context.Canceled", round, err)
		}
		start := time.Now()
		next, err2 := other.Acquire(ctxFor(t), n, fence.Wait(time.Second+s.cfg.Slack))
		if err2 != nil {
			t.Fatalf("round %d: after an Acquire cancelled mid-call (%v), another caller waiting %v = %v: the lock is held for nobody", round, err, time.Second+s.cfg.Slack, err2)
		}
		if took := time.Since(start); took > time.Second+s.cfg.Slack/2 {
			t.Errorf("round %d: the lock came free %v after an Acquire cancelled mid-call", round, took)
		}
		mustRelease(t, next)
	}
}

// mustBeFree takes the free lock n on l and releases it, or fails t,
// saying why the lock should have been free. As mustAcquire, it tries
// again when the backend gave the lease back, its reply late.
func (s suite) mustBeFree(t testing.TB, l fence.Locker, n, why string) {
	t.Helper()
	for try := 1; ; try++ {
		lease, err := l.Acquire(ctxFor(t), n)
		switch {
		case err == nil:
			mustRelease(t, lease)
			return
		case !errors.Is(err, fence.ErrLeaseLost) || try == 5:
			t.Fatalf("%s: Acquire = %v", why, err)
		}
		t.Logf("%s: Acquire = %v; trying again", why, err)
	}
}

// releaseDoneTwice: a lease released with a done ctx twice, then with a
// live one, nothing lost: whatever the first call left behind (a delete
// in the background, a revoke) may have freed the lock by the second, and
// that is no sign of a loss. The third call returns nil (the lease's own
// doing, as after any failed Release), never ErrLeaseLost, and the lock is
// free.
func (s suite) releaseDoneTwice(t *testing.T) {
	l, other := s.cfg.New(t), s.cfg.New(t)
	n := name(t)
	lease := s.mustAcquire(t, l, n, fence.TTL(30*time.Second))
	done, cancel := context.WithCancel(ctxFor(t))
	cancel()
	first := lease.Release(done)
	second := lease.Release(done)
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release with a live ctx after two with a done one (%v, %v) = %v, want nil: nothing was lost", first, second, err)
	}
	s.mustBeFree(t, other, n, "the lock is not free after a Release returned nil")
}
