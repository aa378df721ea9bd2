package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/observetest"
)

// A Release that fails (its ctx done) ends the lease as released, as in
// every other backend (fence.Lease: "Release ends the lease"): the Observer
// sees one LeaseEnded, cause released. etcdlock used to keep the lease
// running until its TTL and then report it lost (expired), counting a
// release as a loss in etcd's metrics alone. Release again retries the
// delete, and the lock is free at once.
func TestObserverFailedReleaseIsReleased(t *testing.T) {
	rec := &observetest.Recorder{}
	l := newLocker(t, shared.Endpoints(), &etcdlock.Options{Observer: rec})
	ctx := ctxFor(t, 30*time.Second)
	lease, err := l.Acquire(ctx, "rel", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := lease.Release(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release with a done ctx = %v, want context.Canceled", err)
	}
	waitDone(t, lease, 5*time.Second)
	if err := lease.Err(); !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("Err after a failed Release = %v, want ErrReleased", err)
	}
	if ends := rec.WaitEnds(t, 1, 5*time.Second); ends[0].Cause != fence.Released {
		t.Fatalf("LeaseEnded %+v, want released", ends[0])
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release again: %v", err)
	}
	next, err := l.Acquire(ctx, "rel", fence.TTL(time.Minute), fence.Wait(0))
	if err != nil {
		t.Fatalf("Acquire after the retried Release: %v", err)
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ends := rec.Ends(); len(ends) != 2 || ends[1].Cause != fence.Released || ends[1].Token != next.Token() {
		t.Fatalf("LeaseEnded events %+v, want two released", ends)
	}
}
