package etcdlock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/observetest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// checkEnds fails t unless rec saw exactly the leases want end, in order,
// each once and as released.
func checkEnds(t *testing.T, rec *observetest.Recorder, want ...fence.Lease) {
	t.Helper()
	ends := rec.Ends()
	ok := len(ends) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = ends[i].Token == want[i].Token() && ends[i].Cause == fence.Released
	}
	if !ok {
		t.Fatalf("LeaseEnded events %+v, want %d, released, tokens of %v", ends, len(want), want)
	}
}

// revoked fails t unless the etcd lease id is gone on the server.
func revoked(t *testing.T, admin *clientv3.Client, id clientv3.LeaseID) {
	t.Helper()
	ttl, err := admin.TimeToLive(ctxFor(t, 10*time.Second), id)
	if err != nil || ttl.TTL != -1 {
		t.Fatalf("etcd lease %x: %+v, %v; want it revoked", int64(id), ttl, err)
	}
}

// A Release that fails (its ctx done) ends the lease as released and
// revokes its etcd lease: that etcd lease is never kept for the next
// Acquire (which would then run on a revoked lease, or on one a late revoke
// takes away), and the retried Release, whose delete finds the key gone,
// keeps nothing either. The Observer sees each lease end once, released,
// the recycled one included, and the old handles cannot touch the new
// holder on the reused etcd lease.
func TestFailedReleaseNotKept(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	rec := &observetest.Recorder{}
	l := newLocker(t, endpoints, &etcdlock.Options{Observer: rec})
	name := t.Name()
	ctx := ctxFor(t, 30*time.Second)

	a, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := a.Release(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release with a done ctx = %v, want context.Canceled", err)
	}
	if err := a.Err(); !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("Err after a failed Release = %v, want ErrReleased", err)
	}
	if ids := l.SpareIDs(); slices.Contains(ids, leaseID(t, a)) {
		t.Fatalf("the failed Release's etcd lease %x was kept: spares %x", int64(leaseID(t, a)), ids)
	}
	revoked(t, admin, leaseID(t, a))
	b, err := l.Acquire(ctx, name, fence.TTL(time.Minute), fence.Wait(0))
	if err != nil {
		t.Fatalf("Acquire after the failed Release: %v", err)
	}
	if leaseID(t, b) == leaseID(t, a) {
		t.Fatalf("Acquire reused the failed Release's etcd lease %x", int64(leaseID(t, a)))
	}
	checkEnds(t, rec, a)

	// The retry finds the key gone with the revoked etcd lease: nil, and
	// nothing kept, nothing reported again, the new holder untouched.
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release again: %v", err)
	}
	if ids := l.SpareIDs(); len(ids) != 0 {
		t.Fatalf("spares %x after the retried Release, want none", ids)
	}
	if b.Err() != nil || countKeys(t, admin, l.Prefix(name)) != 1 {
		t.Fatalf("holder after the old lease's retried Release: Err %v, %d keys", b.Err(), countKeys(t, admin, l.Prefix(name)))
	}
	checkEnds(t, rec, a)

	// A Release that went through keeps its etcd lease, reported once as
	// released; the next Acquire reuses it, and the old handle's calls do
	// not reach the new holder.
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := l.SpareIDs(); !slices.Equal(ids, []clientv3.LeaseID{leaseID(t, b)}) {
		t.Fatalf("spares %x after a Release that went through, want [%x]", ids, int64(leaseID(t, b)))
	}
	checkEnds(t, rec, a, b)
	c, err := l.Acquire(ctx, name, fence.TTL(time.Minute), fence.Wait(0))
	if err != nil {
		t.Fatal(err)
	}
	if leaseID(t, c) != leaseID(t, b) {
		t.Fatalf("Acquire on etcd lease %x, want the kept %x", int64(leaseID(t, c)), int64(leaseID(t, b)))
	}
	if err := b.Release(done); err != nil {
		t.Fatalf("Release with a done ctx of the released lease = %v, want its first result (nil)", err)
	}
	if err := b.Extend(ctx, time.Minute); !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("Extend of the released lease = %v, want ErrReleased", err)
	}
	select {
	case <-c.Done():
		t.Fatalf("new holder ended: %v", c.Err())
	default:
	}
	if c.Err() != nil || countKeys(t, admin, l.Prefix(name)) != 1 {
		t.Fatalf("holder on the reused etcd lease: Err %v, %d keys", c.Err(), countKeys(t, admin, l.Prefix(name)))
	}
	checkEnds(t, rec, a, b)
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkEnds(t, rec, a, b, c)
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	revoked(t, admin, leaseID(t, c))
}

// A Release that cannot wait for ls.op (its ctx done while another
// Release holds it, its delete in flight) ends the lease as released and
// revokes the etcd lease; the Release in flight, whose delete then goes
// through, must not keep that revoked etcd lease for the next Acquire, and
// the Observer sees one end, released.
func TestFailedReleaseDuringReleaseNotKept(t *testing.T) {
	endpoints := shared.Endpoints()
	var h txnHook
	rec := &observetest.Recorder{}
	l, err := etcdlock.New(hookedClient(t, endpoints, &h), &etcdlock.Options{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	admin := newClient(t, endpoints, nil)
	name := t.Name()
	ctx := ctxFor(t, 30*time.Second)
	a, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	var once sync.Once
	var failed error
	h.set(func(err error) error {
		// The first Txn after this is the Release's delete, applied: a
		// second Release, its ctx done, finds ls.op taken.
		once.Do(func() { failed = a.Release(done) })
		return err
	})
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release = %v", err)
	}
	h.set(func(err error) error { return err })
	if !errors.Is(failed, context.Canceled) {
		t.Fatalf("concurrent Release with a done ctx = %v, want context.Canceled", failed)
	}
	if ids := l.SpareIDs(); len(ids) != 0 {
		t.Fatalf("spares %x: the etcd lease the failed Release revoked was kept", ids)
	}
	revoked(t, admin, leaseID(t, a))
	checkEnds(t, rec, a)
	b, err := l.Acquire(ctx, name, fence.TTL(time.Minute), fence.Wait(0))
	if err != nil {
		t.Fatal(err)
	}
	if leaseID(t, b) == leaseID(t, a) {
		t.Fatalf("Acquire reused the revoked etcd lease %x", int64(leaseID(t, a)))
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkEnds(t, rec, a, b)
}

// A fixed lease that expired, not extended, is not kept for reuse: Release
// reports it lost, its etcd lease is revoked, and the Observer sees it end
// once, expired.
func TestExpiredLeaseNotKept(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	rec := &observetest.Recorder{}
	l := newLocker(t, endpoints, &etcdlock.Options{Observer: rec})
	ctx := ctxFor(t, 30*time.Second)
	a, err := l.Acquire(ctx, t.Name(), fence.TTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, a, 5*time.Second)
	if err := a.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of an expired lease = %v, want ErrLeaseLost", err)
	}
	if ids := l.SpareIDs(); len(ids) != 0 {
		t.Fatalf("spares %x after an expired lease's Release, want none", ids)
	}
	revoked(t, admin, leaseID(t, a))
	if ends := rec.Ends(); len(ends) != 1 || ends[0].Cause != fence.LostExpired || ends[0].Token != a.Token() {
		t.Fatalf("LeaseEnded events %+v, want one, expired", ends)
	}
}
