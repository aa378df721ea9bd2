package etcdlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"go.etcd.io/etcd/client/v3/namespace"
)

// A careless user wraps the client in etcd's namespace package after New
// (one service wraps before, another after): every call of the Locker must
// still go through client.KV as it is at the call, as all did before the
// create Txn and the delete were hand-built. Otherwise the key is created
// outside the namespace while the waiter's checks, Extend's Txn, the
// watch and IsOwner look inside it: a Locker wrapped before New does not
// see the lock (two holders at once), and Extend finds the key gone.
func TestNamespaceWrappedAfterNew(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	const ns = "late/"
	wrap := func() *etcdlock.Locker {
		c := newClient(t, endpoints, nil)
		l, err := etcdlock.New(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.KV = namespace.NewKV(c.KV, ns)
		c.Watcher = namespace.NewWatcher(c.Watcher, ns)
		c.Lease = namespace.NewLease(c.Lease, ns)
		return l
	}
	before := func() *etcdlock.Locker {
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
	l, other := wrap(), before()
	ctx := ctxFor(t, 30*time.Second)
	a, err := l.Acquire(ctx, t.Name(), fence.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	key := a.(*etcdlock.Lease).Key()
	if n, bare := countKeys(t, admin, ns+key), countKeys(t, admin, key); n != 1 || bare != 0 {
		t.Fatalf("held: %d keys %s, %d keys %s; want the key under the namespace only", n, ns+key, bare, key)
	}
	if b, err := other.Acquire(ctx, t.Name(), fence.Wait(0)); !errors.Is(err, fence.ErrHeld) {
		if err == nil {
			_ = b.Release(ctx)
		}
		t.Fatalf("a Locker wrapped before New, while the lock is held: Acquire = %v, want ErrHeld", err)
	}
	if err := a.Extend(ctx, 20*time.Second); err != nil {
		t.Fatalf("Extend = %v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatalf("Release = %v", err)
	}
	if n, bare := countKeys(t, admin, ns+key), countKeys(t, admin, key); n != 0 || bare != 0 {
		t.Fatalf("released: %d keys %s, %d keys %s; want none", n, ns+key, bare, key)
	}
}
