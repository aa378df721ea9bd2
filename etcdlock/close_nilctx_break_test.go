package etcdlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// Locker.Close(nil) on a Locker that kept an etcd lease for reuse
// panicked (a nil pointer dereference in the revoke's context.WithTimeout):
// a nil ctx is the caller's mistake, which Close reports as a bad argument,
// fence.ErrInvalidOption, as redlock's does, leaving the Locker open and
// its spare kept for the Close called with a ctx.
func TestCloseNilContext(t *testing.T) {
	l := newLocker(t, shared.Endpoints(), nil)
	admin := newClient(t, shared.Endpoints(), nil)
	spare := keepSpare(t, l)
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("Locker.Close(nil) with a spare kept panicked: %v", p)
			}
		}()
		err = l.Close(nil) //lint:ignore SA1012 the nil ctx is the case under test
	}()
	if !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("Locker.Close(nil) = %v, want an error matching fence.ErrInvalidOption", err)
	}
	lease := acquire(t, l, t.Name(), 30*time.Second) // still open
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("Locker.Close after Close(nil) = %v", err)
	}
	wantSpareRevoked(t, admin, spare, "Close(nil), then Close")
}
