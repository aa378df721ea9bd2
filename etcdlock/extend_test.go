package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/memlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Extend moves the key onto a new etcd lease of the new TTL and revokes the
// old one; the key's create revision, the token, stays.
func TestExtendMovesKeyToNewLease(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l := newLocker(t, endpoints, nil)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	old := leaseID(t, lease)
	if err := lease.Extend(ctxFor(t, 10*time.Second), time.Minute); err != nil {
		t.Fatal(err)
	}
	key := lease.(*etcdlock.Lease).Key()
	resp, err := admin.Get(ctxFor(t, 10*time.Second), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get(%s) = %v, %v", key, resp, err)
	}
	kv := resp.Kvs[0]
	if kv.CreateRevision != int64(lease.Token()) {
		t.Fatalf("create revision %d, token %d", kv.CreateRevision, lease.Token())
	}
	if clientv3.LeaseID(kv.Lease) == old {
		t.Fatal("the key is still on its old etcd lease")
	}
	ttl, err := admin.TimeToLive(ctxFor(t, 10*time.Second), clientv3.LeaseID(kv.Lease))
	if err != nil || ttl.GrantedTTL != 60 {
		t.Fatalf("the new etcd lease: %+v, %v; want a granted TTL of 60 s", ttl, err)
	}
	if ttl, err := admin.TimeToLive(ctxFor(t, 10*time.Second), old); err != nil || ttl.TTL != -1 {
		t.Fatalf("the old etcd lease: %+v, %v; want revoked (TTL -1)", ttl, err)
	}
	if lease.Err() != nil {
		t.Fatalf("lease ended by Extend: %v", lease.Err())
	}
	// Extending a lease whose key is gone reports it lost.
	removeHolder(t, admin, t.Name())
	waitDone(t, lease, 5*time.Second)
	if err := lease.Extend(ctxFor(t, 10*time.Second), time.Minute); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend of a removed lease = %v, want ErrLeaseLost", err)
	}
}

func TestIsOwnerForeignLease(t *testing.T) {
	m, _ := memlock.New(nil)
	lease, err := m.Acquire(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	if _, err := etcdlock.IsOwner(lease); !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("IsOwner(memlock lease) = %v, want ErrInvalidOption", err)
	}
}

// A watchdog lease goes on being renewed after Extend, on its new etcd
// lease: two lease times later it still holds.
func TestExtendWatchdogLease(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l := newLocker(t, endpoints, &etcdlock.Options{WatchdogTTL: time.Second})
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	old := leaseID(t, lease)
	if err := lease.Extend(ctxFor(t, 10*time.Second), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Done():
		t.Fatalf("watchdog lease ended after Extend: %v", lease.Err())
	case <-time.After(5 * time.Second):
	}
	resp, err := admin.Get(ctxFor(t, 10*time.Second), lease.(*etcdlock.Lease).Key())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("key: %v, %v", resp, err)
	}
	if id := clientv3.LeaseID(resp.Kvs[0].Lease); id == old {
		t.Fatal("the key is still on its old etcd lease")
	}
	if !time.Now().Before(lease.Deadline()) {
		t.Fatalf("deadline %v has passed", lease.Deadline())
	}
}
