package memlock_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// fence.Lease's Release: "The lease ends before the delete is sent (Err,
// Done and Context say so at once)", and fencetest's comment: "A Release
// that failed (a done ctx) has ended the lease, and cancelled its
// Context". redislock ends the lease locally before its script goes out,
// whatever ctx; memlock, the reference, keeps a lease whose Release got a
// done ctx fully alive: Err nil, Done open, Context live, until its
// deadline (until this change). A careless `defer lease.Release(r.Context())` after the client
// went away then leaves work on lease.Context() running for the whole TTL
// on memlock, and stops it at once on Redis: tests on memlock do not show
// what production does.
func TestReleaseWithDoneCtxEndsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLocker(t, time.Second)
		lease := mustAcquire(t, l, "n", fence.TTL(time.Minute))
		done, cancel := context.WithCancel(context.Background())
		cancel()
		if err := lease.Release(done); err == nil {
			t.Fatal("Release(done ctx) = nil, want ctx's error")
		}
		if !errors.Is(lease.Err(), fence.ErrReleased) || lease.Context().Err() == nil {
			t.Fatalf("after Release(done ctx): Err %v, Context's Err %v; want the lease ended (ErrReleased)", lease.Err(), lease.Context().Err())
		}
		if _, err := l.Acquire(t.Context(), "n"); !errors.Is(err, fence.ErrHeld) {
			t.Fatalf("the lock was freed by a Release that failed: %v", err)
		}
		if err := lease.Release(lease.Context()); err != nil {
			t.Fatalf("Release retried with lease.Context() = %v", err)
		}
		mustRelease(t, mustAcquire(t, l, "n"))
	})
}
