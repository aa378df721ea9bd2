package redlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// Locker.Close(nil) with a lease held panicked (the lease's release with a
// nil ctx); with nothing held it returned nil and closed the Locker. A nil
// ctx is the caller's mistake, which Close reports as a bad argument,
// fence.ErrInvalidOption, as etcdlock's does, leaving the Locker open and
// the lease held for the Close called with a ctx to release.
func TestCloseNilContext(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "close-nil-ctx"
	l := newLocker(t, srvs, nil)
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("Locker.Close(nil) with a lease held panicked: %v", p)
			}
		}()
		err = l.Close(nil) //lint:ignore SA1012 the nil ctx is the case under test
	}()
	if !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("Locker.Close(nil) = %v, want an error matching fence.ErrInvalidOption", err)
	}
	if lease.Err() != nil {
		t.Fatalf("the lease ended at Close(nil): %v", lease.Err())
	}
	if on := lockedOn(t, srvs, name); len(on) != len(srvs) {
		t.Fatalf("locked on %v after Close(nil), want every node", on)
	}
	if err := l.Close(ctxFor(t)); err != nil {
		t.Fatalf("Locker.Close after Close(nil) = %v", err)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Fatalf("still locked on %v after Close", on)
	}
}
