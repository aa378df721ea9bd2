package fencetest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
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

// reentered is what the callback's calls into the lease returned.
type reentered struct {
	cause          fence.LeaseCause // "" for the Logger
	extend         error
	release, again error
}

// reenterer calls the lease's Extend and Release (twice) from the callback
// that reports its end, and sends what they returned on done.
type reenterer struct {
	fence.NopObserver
	mu    sync.Mutex
	lease fence.Lease
	done  chan reentered
}

func newReenterer() *reenterer { return &reenterer{done: make(chan reentered, 1)} }

func (r *reenterer) set(lease fence.Lease) { r.mu.Lock(); r.lease = lease; r.mu.Unlock() }

// LeaseEnded calls back into the lease.
func (r *reenterer) LeaseEnded(ev fence.LeaseEvent) { r.call(ev.Cause) }

func (r *reenterer) call(cause fence.LeaseCause) {
	r.mu.Lock()
	lease := r.lease
	r.lease = nil // once
	r.mu.Unlock()
	if lease == nil {
		return
	}
	// Bounded, so that a call that waits for the callback's own caller
	// returns a context error (a failure) rather than hanging; a deadlock
	// on a lock ignores it, and the test's wait reports it.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res := reentered{cause: cause}
	res.extend = lease.Extend(ctx, time.Second)
	res.release = lease.Release(ctx)
	res.again = lease.Release(ctx)
	r.done <- res
}

// reenterHandler is a slog.Handler whose Handle calls back into the lease
// on a record whose message says the lease was lost.
type reenterHandler struct{ r *reenterer }

func (h reenterHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h reenterHandler) Handle(_ context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, "lease lost") {
		h.r.call("")
	}
	return nil
}
func (h reenterHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h reenterHandler) WithGroup(string) slog.Handler      { return h }

// awaitReentry waits up to limit for the callback's calls to return, and
// fails the test with every goroutine's stack if they have not: the
// callback deadlocked.
func awaitReentry(t *testing.T, r *reenterer, limit time.Duration) reentered {
	t.Helper()
	select {
	case res := <-r.done:
		return res
	case <-time.After(limit):
		fatalStacks(t, fmt.Sprintf("the callback's calls into the lease did not return within %v (deadlock?)", limit))
		return reentered{}
	}
}

// fatalStacks fails the test with msg and every goroutine's stack.
func fatalStacks(t *testing.T, msg string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	t.Fatalf("%s; goroutines:\n%s", msg, buf)
}

// wantLost checks that every call from the callback of a lost lease
// returned an error matching fence.ErrLeaseLost.
func wantLost(t *testing.T, res reentered) {
	t.Helper()
	if !errors.Is(res.extend, fence.ErrLeaseLost) {
		t.Errorf("Extend from the callback = %v, want ErrLeaseLost", res.extend)
	}
	if !errors.Is(res.release, fence.ErrLeaseLost) {
		t.Errorf("Release from the callback = %v, want ErrLeaseLost", res.release)
	}
	if !errors.Is(res.again, fence.ErrLeaseLost) {
		t.Errorf("second Release from the callback = %v, want ErrLeaseLost", res.again)
	}
}

// reenterLost: the lock is removed behind a watchdog lease's back, and the
// renewal that finds it gone (or the session's watch) reports the loss.
func (s suite) reenterLost(t *testing.T, logged bool) {
	r := newReenterer()
	var l fence.Locker
	if logged {
		l = s.cfg.NewLogged(t, slog.New(reenterHandler{r}))
	} else {
		l = s.cfg.NewObserved(t, r)
	}
	n := name(t)
	lease := mustAcquire(t, l, n)
	r.set(lease)
	// In a goroutine of its own: a backend may end the lease, and make the
	// callback, on the goroutine that removes the lock.
	removed := make(chan struct{})
	go func() { defer close(removed); s.cfg.Remove(t, n) }()
	res := awaitReentry(t, r, 10*s.cfg.WatchdogTTL+10*time.Second)
	select {
	case <-removed:
	case <-time.After(10 * time.Second):
		fatalStacks(t, "Remove did not return within 10s after the callback did (deadlock?)")
	}
	if !logged && res.cause == fence.Released {
		t.Errorf("cause %q, want a loss", res.cause)
	}
	wantLost(t, res)
	if err := lease.Release(ctxFor(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release after the callback = %v, want ErrLeaseLost", err)
	}
}

// reenterExpired: the expiry timer ends a lease with a fixed TTL.
func (s suite) reenterExpired(t *testing.T) {
	r := newReenterer()
	l := s.cfg.NewObserved(t, r)
	lease := mustAcquire(t, l, name(t), fence.TTL(200*time.Millisecond))
	r.set(lease)
	res := awaitReentry(t, r, 10*time.Second)
	if res.cause == fence.Released {
		t.Errorf("cause %q, want a loss", res.cause)
	}
	wantLost(t, res)
}

// reenterReleased: Release ends the lease and the Observer, told Released,
// calls Release again, which returns Release's own result.
func (s suite) reenterReleased(t *testing.T) {
	r := newReenterer()
	l := s.cfg.NewObserved(t, r)
	lease := mustAcquire(t, l, name(t))
	r.set(lease)
	outer := make(chan error, 1)
	ctx := ctxFor(t)
	go func() { outer <- lease.Release(ctx) }()
	res := awaitReentry(t, r, 10*time.Second)
	var err error
	select {
	case err = <-outer:
	case <-time.After(10 * time.Second):
		t.Fatal("Release did not return after its callback did")
	}
	if err != nil {
		t.Fatalf("Release = %v", err)
	}
	if res.cause != fence.Released {
		t.Errorf("cause %q, want %q", res.cause, fence.Released)
	}
	if !errors.Is(res.extend, fence.ErrReleased) && !errors.Is(res.extend, fence.ErrLeaseLost) {
		t.Errorf("Extend from the callback = %v, want ErrReleased or ErrLeaseLost", res.extend)
	}
	if res.release != nil || res.again != nil {
		t.Errorf("Release from the callback = %v, then %v; want nil, Release's result", res.release, res.again)
	}
}

// reenterExtend: the holder's Extend finds the lock removed and reports
// the loss (where Remove itself, or a watch, does not end the lease first).
func (s suite) reenterExtend(t *testing.T) {
	r := newReenterer()
	l := s.cfg.NewObserved(t, r)
	n := name(t)
	lease := mustAcquire(t, l, n, fence.TTL(10*time.Second))
	r.set(lease)
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
	res := awaitReentry(t, r, 10*time.Second+s.cfg.SessionBound)
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
