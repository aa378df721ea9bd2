package fencetest

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
)

// reentry runs the re-entry subtests: an Observer, or a Logger's handler,
// that calls the lease's Release and Extend from the callback that reports
// its end ("on lease lost, release and clean up") must not deadlock,
// whichever goroutine ends the lease: the watchdog's renewal, the expiry
// timer, Release, or an Extend that finds the lease lost.
func (s suite) reentry(t *testing.T) {
	if s.cfg.NewObserved != nil {
		t.Run("LostWhileRenewed", func(t *testing.T) { s.reenterLost(t, false) })
		t.Run("Expired", s.reenterExpired)
		t.Run("Released", s.reenterReleased)
		t.Run("ExtendFindsLost", s.reenterExtend)
	}
	if s.cfg.NewLogged != nil {
		t.Run("LoggerLostWhileRenewed", func(t *testing.T) { s.reenterLost(t, true) })
	}
}

// fatalStacks fails the test with msg and every goroutine's stack.
func fatalStacks(t *testing.T, msg string) {
	t.Helper()
	t.Fatalf("%s; goroutines:\n%s", msg, observetest.Stacks())
}

// wantLost checks that every call from the callback of a lost lease
// returned an error matching fence.ErrLeaseLost.
func wantLost(t *testing.T, res observetest.ReentryCalls) {
	t.Helper()
	if !errors.Is(res.Extend, fence.ErrLeaseLost) {
		t.Errorf("Extend from the callback = %v, want ErrLeaseLost", res.Extend)
	}
	if !errors.Is(res.Release, fence.ErrLeaseLost) {
		t.Errorf("Release from the callback = %v, want ErrLeaseLost", res.Release)
	}
	if !errors.Is(res.Again, fence.ErrLeaseLost) {
		t.Errorf("second Release from the callback = %v, want ErrLeaseLost", res.Again)
	}
	if !errors.Is(res.Err, fence.ErrLeaseLost) || !res.DoneClosed {
		t.Errorf("from the callback: Err = %v, Done closed %v; want ErrLeaseLost, true", res.Err, res.DoneClosed)
	}
}

// reenterLost: the lock is removed behind a watchdog lease's back, and the
// renewal that finds it gone (or the session's watch) reports the loss.
func (s suite) reenterLost(t *testing.T, logged bool) {
	r := observetest.NewReentry()
	var l fence.Locker
	if logged {
		l = s.cfg.NewLogged(t, slog.New(r.Handler()))
	} else {
		l = s.cfg.NewObserved(t, r)
	}
	n := name(t)
	lease := s.mustAcquire(t, l, n)
	r.Set(lease)
	// In a goroutine of its own: a backend may end the lease, and make the
	// callback, on the goroutine that removes the lock.
	removed := make(chan struct{})
	go func() { defer close(removed); s.cfg.Remove(t, n) }()
	res := r.Calls(t, 10*s.cfg.WatchdogTTL+10*time.Second)
	select {
	case <-removed:
	case <-time.After(10 * time.Second):
		fatalStacks(t, "Remove did not return within 10s after the callback did (deadlock?)")
	}
	if !logged && res.Cause == fence.Released {
		t.Errorf("cause %q, want a loss", res.Cause)
	}
	wantLost(t, res)
	if err := lease.Release(ctxFor(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release after the callback = %v, want ErrLeaseLost", err)
	}
}

// reenterExpired: the expiry timer ends a lease with a fixed TTL.
func (s suite) reenterExpired(t *testing.T) {
	r := observetest.NewReentry()
	l := s.cfg.NewObserved(t, r)
	lease := s.mustAcquire(t, l, name(t), fence.TTL(200*time.Millisecond))
	r.Set(lease)
	res := r.Calls(t, 10*time.Second)
	if res.Cause == fence.Released {
		t.Errorf("cause %q, want a loss", res.Cause)
	}
	wantLost(t, res)
}

// reenterReleased: Release ends the lease and the Observer, told Released,
// calls Release again, which returns Release's own result.
func (s suite) reenterReleased(t *testing.T) {
	r := observetest.NewReentry()
	l := s.cfg.NewObserved(t, r)
	lease := s.mustAcquire(t, l, name(t))
	r.Set(lease)
	outer := make(chan error, 1)
	ctx := ctxFor(t)
	go func() { outer <- lease.Release(ctx) }()
	res := r.Calls(t, 10*time.Second)
	var err error
	select {
	case err = <-outer:
	case <-time.After(10 * time.Second):
		t.Fatal("Release did not return after its callback did")
	}
	if err != nil {
		t.Fatalf("Release = %v", err)
	}
	if res.Cause != fence.Released {
		t.Errorf("cause %q, want %q", res.Cause, fence.Released)
	}
	if !errors.Is(res.Extend, fence.ErrReleased) && !errors.Is(res.Extend, fence.ErrLeaseLost) {
		t.Errorf("Extend from the callback = %v, want ErrReleased or ErrLeaseLost", res.Extend)
	}
	if res.Release != nil || res.Again != nil {
		t.Errorf("Release from the callback = %v, then %v; want nil, Release's result", res.Release, res.Again)
	}
	if !errors.Is(res.Err, fence.ErrReleased) || !errors.Is(res.ContextCause, fence.ErrReleased) || !res.DoneClosed {
		t.Errorf("from the callback: Err = %v, Context's cause %v, Done closed %v; want ErrReleased, ErrReleased, true",
			res.Err, res.ContextCause, res.DoneClosed)
	}
}

// reenterExtend: the holder's Extend finds the lock removed and reports
// the loss (where Remove itself, or a watch, does not end the lease first).
func (s suite) reenterExtend(t *testing.T) {
	r := observetest.NewReentry()
	l := s.cfg.NewObserved(t, r)
	n := name(t)
	lease := s.mustAcquire(t, l, n, fence.TTL(10*time.Second))
	r.Set(lease)
	removed := make(chan struct{})
	go func() { defer close(removed); s.cfg.Remove(t, n) }()
	select {
	case <-removed:
	case <-time.After(10 * time.Second):
		fatalStacks(t, "Remove did not return within 10s (deadlock?)")
	}
	outer := make(chan error, 1)
	ctx := ctxFor(t)
	go func() { outer <- lease.Extend(ctx, 10*time.Second) }()
	res := r.Calls(t, 10*time.Second+s.cfg.SessionBound)
	select {
	case err := <-outer:
		if !errors.Is(err, fence.ErrLeaseLost) {
			t.Errorf("Extend = %v, want ErrLeaseLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Extend did not return after its callback did")
	}
	wantLost(t, res)
}
