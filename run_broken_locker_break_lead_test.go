package fence_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// noLeaseLocker is a careless Locker (a stub, a wrapper that drops a
// result): Acquire returns neither a lease nor an error.
type noLeaseLocker struct{ n atomic.Int64 }

func (l *noLeaseLocker) Acquire(context.Context, string, ...fence.Option) (fence.Lease, error) {
	l.n.Add(1)
	return nil, nil
}

// Before, Run called Context on the nil lease and panicked with a nil
// pointer dereference, and so did Lead, on its caller's goroutine. Now Run
// returns an error matching ErrNotAcquired without calling fn, and Lead
// treats it as a failed campaign: it backs off and returns when ctx ends.
func TestRunLockerReturnsNoLeaseNoError(t *testing.T) {
	l := &noLeaseLocker{}
	called := false
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("Run panicked: %v", p)
			}
		}()
		return fence.Run(t.Context(), l, "x", func(context.Context, fence.Lease) error { called = true; return nil })
	}()
	if !errors.Is(err, fence.ErrNotAcquired) || called {
		t.Fatalf("Run = %v (fn called: %v), want ErrNotAcquired and fn not called", err, called)
	}

	synctest.Test(t, func(t *testing.T) {
		l := &noLeaseLocker{}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			defer func() {
				if p := recover(); p != nil {
					done <- errors.New("Lead panicked")
				}
			}()
			done <- fence.Lead(ctx, l, "x", func(context.Context, fence.Lease) error { return nil },
				fence.Backoff(100*time.Millisecond, time.Second))
		}()
		if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lead = %v, want ctx's DeadlineExceeded after 10 s", err)
		}
		// Backing off to 1 s: about 10 campaigns in 10 s, not a hot loop.
		if n := l.n.Load(); n > 30 {
			t.Fatalf("Lead campaigned %d times in 10 s against a Locker that grants nothing", n)
		}
	})
}

// leaseAndErrorLocker returns the lease it took together with an error,
// against the contract (no lease with an error). Run returned the error and
// dropped the lease: nobody could release it, and its watchdog renewed the
// lock for ever.
type leaseAndErrorLocker struct{ fence.Locker }

func (l leaseAndErrorLocker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	lease, err := l.Locker.Acquire(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	return lease, errors.New("backend: reply garbled")
}

func TestRunLockerReturnsLeaseAndError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMemlock(t) // watchdog TTL 1 s
		err := fence.Run(t.Context(), leaseAndErrorLocker{m}, "x", func(context.Context, fence.Lease) error {
			t.Error("fn called with an Acquire error")
			return nil
		})
		if err == nil {
			t.Fatal("Run = nil, want Acquire's error")
		}
		// Far past the watchdog TTL: a dropped lease would still be renewed.
		time.Sleep(time.Minute) // synctest: fake time
		lease, err := m.Acquire(t.Context(), "x")
		if err != nil {
			t.Fatalf("the lease Run dropped still holds the lock a minute later: %v", err)
		}
		_ = lease.Release(t.Context())
	})
}

// typedNilLocker returns a nil *typedNilLease in the fence.Lease interface,
// as a backend does that returns its own pointer variable: with an error
// (the contract's "no lease"), or without one (a broken backend).
type typedNilLocker struct{ err error }

type typedNilLease struct{ fence.Lease }

func (l typedNilLocker) Acquire(context.Context, string, ...fence.Option) (fence.Lease, error) {
	var ls *typedNilLease
	return ls, l.err
}

// TestRunLockerReturnsTypedNilLease: Run takes a nil pointer in the Lease
// interface for no lease: with an error, the error, nothing released (a
// Release on it would panic); without one, ErrNotAcquired. fn is not
// called either way.
func TestRunLockerReturnsTypedNilLease(t *testing.T) {
	held := fmt.Errorf("backend: %w", fence.ErrHeld)
	for _, l := range []typedNilLocker{{err: held}, {}} {
		called := false
		err := fence.Run(t.Context(), l, "x", func(context.Context, fence.Lease) error { called = true; return nil })
		if called {
			t.Fatal("fn called without a lease")
		}
		if l.err != nil && err != held || l.err == nil && !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("Acquire returned a nil *typedNilLease and %v: Run returned %v", l.err, err)
		}
	}
}
