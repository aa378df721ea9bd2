package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

// A released lock's etcd lease is kept for the Locker's next Acquire (no
// Grant, no Revoke), and the old Lease, ended, cannot touch the new holder:
// its Release, Extend and IsOwner all see it ended, although both keys have
// the same name.
func TestSpareReused(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l := newLocker(t, endpoints, nil)
	name := t.Name()
	a, err := l.Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	b, err := l.Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	if leaseID(t, b) != leaseID(t, a) {
		t.Fatalf("second Acquire on etcd lease %x, want the released %x reused", leaseID(t, b), leaseID(t, a))
	}
	if b.Token() <= a.Token() {
		t.Fatalf("token %d after %d", b.Token(), a.Token())
	}
	if err := a.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("second Release of the first lease = %v, want its first result (nil)", err)
	}
	if err := a.Extend(ctxFor(t, 10*time.Second), time.Minute); !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("Extend of the released lease = %v, want ErrReleased", err)
	}
	cmp, err := etcdlock.IsOwner(a)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := admin.Txn(ctxFor(t, 10*time.Second)).If(cmp).Commit()
	if err != nil || resp.Succeeded {
		t.Fatalf("IsOwner(released lease) Txn = %v, %v; want it to fail", resp, err)
	}
	if b.Err() != nil || countKeys(t, admin, l.Prefix(name)) != 1 {
		t.Fatalf("second holder: Err %v, %d keys", b.Err(), countKeys(t, admin, l.Prefix(name)))
	}
	if err := b.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Close revokes the kept etcd lease.
	if err := l.Close(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	ttl, err := admin.TimeToLive(ctxFor(t, 10*time.Second), leaseID(t, b))
	if err != nil || ttl.TTL != -1 {
		t.Fatalf("kept etcd lease after Close: %+v, %v; want it revoked", ttl, err)
	}
}

// A kept etcd lease revoked behind the Locker's back (etcdctl lease revoke)
// costs the next Acquire a Grant, not the lock: the create Txn fails on the
// missing lease, writing nothing, and Acquire grants a new one.
func TestSpareRevokedBehindBack(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l := newLocker(t, endpoints, nil)
	name := t.Name()
	a, err := l.Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Revoke(ctxFor(t, 10*time.Second), leaseID(t, a)); err != nil {
		t.Fatal(err)
	}
	b, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.Wait(time.Second))
	if err != nil {
		t.Fatalf("Acquire after the kept etcd lease was revoked = %v", err)
	}
	defer b.Release(context.Background())
	if leaseID(t, b) == leaseID(t, a) {
		t.Fatalf("Acquire used the revoked etcd lease %x", leaseID(t, a))
	}
	if b.Token() <= a.Token() {
		t.Fatalf("token %d after %d", b.Token(), a.Token())
	}
	ttl, err := admin.TimeToLive(ctxFor(t, 10*time.Second), leaseID(t, b))
	if err != nil || ttl.TTL <= 0 {
		t.Fatalf("new etcd lease: %+v, %v", ttl, err)
	}
}

// A lease that was lost (its key deleted behind its back) is not kept for
// reuse: its etcd lease is revoked, and the next Acquire grants another.
func TestLostLeaseNotReused(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l := newLocker(t, endpoints, nil)
	name := t.Name()
	a, err := l.Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Delete(ctxFor(t, 10*time.Second), a.(*etcdlock.Lease).Key()); err != nil {
		t.Fatal(err)
	}
	waitDone(t, a, 5*time.Second)
	if err := a.Release(ctxFor(t, 10*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release = %v, want ErrLeaseLost", err)
	}
	b, err := l.Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(context.Background())
	if leaseID(t, b) == leaseID(t, a) {
		t.Fatalf("Acquire reused the lost lease's etcd lease %x", leaseID(t, a))
	}
}
