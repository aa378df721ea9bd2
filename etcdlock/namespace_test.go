package etcdlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"go.etcd.io/etcd/client/v3/namespace"
)

// A client whose KV, Watcher and Lease are etcd's namespace wrappers: the
// lock's keys live under the namespace, its create Txn and Release's delete
// included (they go through client.KV, not the gRPC client under it),
// another Locker on the namespace is kept out while it is held, and a
// delete of the namespaced key ends the lease.
func TestNamespacedClient(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	const ns = "tenant/"
	namespaced := func() *etcdlock.Locker {
		c := newClient(t, endpoints, nil)
		c.KV = namespace.NewKV(c.KV, ns)
		c.Watcher = namespace.NewWatcher(c.Watcher, ns)
		c.Lease = namespace.NewLease(c.Lease, ns)
		l, err := etcdlock.New(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l, other := namespaced(), namespaced()
	if l.Raw() || !newLocker(t, endpoints, nil).Raw() {
		t.Fatalf("raw requests: namespaced %v, plain %v; want false, true", l.Raw(), newLocker(t, endpoints, nil).Raw())
	}
	ctx := ctxFor(t, 20*time.Second)
	count := func(key string) int64 {
		t.Helper()
		resp, err := admin.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	a, err := l.Acquire(ctx, t.Name(), fence.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	key := a.(*etcdlock.Lease).Key()
	if n, bare := count(ns+key), count(key); n != 1 || bare != 0 {
		t.Fatalf("held: %d keys %s, %d keys %s; want the key under the namespace only", n, ns+key, bare, key)
	}
	if _, err := other.Acquire(ctx, t.Name(), fence.Wait(0)); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("another Acquire on the namespace while held = %v, want ErrHeld", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(ns + key); n != 0 {
		t.Fatalf("released: %d keys %s, want none", n, ns+key)
	}
	b, err := other.Acquire(ctx, t.Name(), fence.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if b.Token() <= a.Token() {
		t.Fatalf("token %d after %d", b.Token(), a.Token())
	}
	if _, err := admin.Delete(ctx, ns+b.(*etcdlock.Lease).Key()); err != nil {
		t.Fatal(err)
	}
	waitDone(t, b, 5*time.Second)
	if err := b.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release after the namespaced key was deleted = %v, want ErrLeaseLost", err)
	}
}
