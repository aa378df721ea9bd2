package etcdlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// TestCloseLeavesNoStaleSpare: a released lock's etcd lease is kept for
// the next Acquire of the same lease time while it is fresh; an Acquire
// that found it too old dropped it from the pool without a revoke, and
// Close, which revokes the etcd leases kept, no longer knew of it. In a
// run of Acquires, Extends and Releases of mixed lease times closed at a
// random moment, 1 to 4 etcd leases out of some 40 were still alive after
// Close had returned nil and the client was closed, each one a dropped
// spare. Here one kept for a 30 s lease, dropped by an Acquire of 2 s,
// was alive after Close had returned nil ('etcd lease ... still alive
// after Close returned nil: TTL 30 s left'), and would have stayed so for
// its whole TTL: a watchdog lease's, or a fence.TTL of an hour.
func TestCloseLeavesNoStaleSpare(t *testing.T) {
	l := newLocker(t, shared.Endpoints(), nil)
	admin := newClient(t, shared.Endpoints(), nil)
	ctx := ctxFor(t, 30*time.Second)
	long, err := l.Acquire(ctx, t.Name()+"-long", fence.TTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	id := leaseID(t, long)
	if err := long.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := l.SpareIDs(); len(ids) != 1 || ids[0] != id {
		t.Fatalf("kept %x after the Release, want [%x]", ids, int64(id))
	}
	// Older than a tenth of its lease time: the next Acquire drops it.
	l.AgeSpares(10 * time.Second)
	short, err := l.Acquire(ctx, t.Name()+"-short", fence.TTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if leaseID(t, short) == id {
		t.Fatal("a spare of another lease time was reused")
	}
	if err := l.Close(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("Close = %v", err)
	}
	r, err := admin.TimeToLive(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if r.TTL > 0 {
		t.Errorf("etcd lease %x still alive after Close returned nil: TTL %d s left", int64(id), r.TTL)
	}
}
