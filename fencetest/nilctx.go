package fencetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// noCtx is the nil context of nilContext, a variable so that the calls
// read as what they are.
var noCtx context.Context

// nilContext: a nil ctx is the caller's mistake. Acquire, Extend and
// Release report it with an error matching fence.ErrInvalidOption before
// they do anything: Acquire takes no lock, Extend and Release leave the
// lease held as it was. A panic, which several backends gave, would take a
// program down over a bad argument (or, in a goroutine of the backend's,
// beyond any recover of the caller's).
func (s suite) nilContext(t *testing.T) {
	l := s.cfg.New(t)
	n := name(t)
	var lease fence.Lease
	err := noPanic(t, "Acquire(nil)", func() (err error) {
		lease, err = l.Acquire(noCtx, n, fence.TTL(10*time.Second))
		return err
	})
	if lease != nil {
		mustRelease(t, lease)
		t.Fatal("Acquire(nil) returned a lease")
	}
	if !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("Acquire(nil) = %v, want an error matching fence.ErrInvalidOption", err)
	}
	// Acquire(nil) took nothing: the lock is free at once.
	lease = s.mustAcquire(t, l, n, fence.TTL(10*time.Second))
	deadline := lease.Deadline()
	for _, c := range []struct {
		what string
		call func() error
	}{
		{"Extend(nil)", func() error { return lease.Extend(noCtx, 20*time.Second) }},
		{"Release(nil)", func() error { return lease.Release(noCtx) }},
	} {
		if err := noPanic(t, c.what, c.call); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("%s = %v, want an error matching fence.ErrInvalidOption", c.what, err)
		}
		if err := lease.Err(); err != nil {
			t.Fatalf("after %s the lease ended: %v", c.what, err)
		}
		if !lease.Deadline().Equal(deadline) {
			t.Errorf("after %s the lease's deadline moved by %v", c.what, lease.Deadline().Sub(deadline))
		}
	}
	// Still held: another Acquire is refused it.
	if other, err := l.Acquire(ctxFor(t), n); err == nil {
		_ = other.Release(ctxFor(t))
		t.Fatal("after Extend(nil) and Release(nil) the lock was free")
	} else if !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("Acquire of the lock held: %v, want ErrHeld", err)
	}
	mustRelease(t, lease)
}

// noPanic calls f, failing t if it panics.
func noPanic(t *testing.T, what string, f func() error) (err error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("%s panicked: %v", what, p)
		}
	}()
	return f()
}
