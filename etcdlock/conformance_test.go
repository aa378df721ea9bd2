package etcdlock_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/fencetest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const watchdogTTL = 500 * time.Millisecond

func TestConformance(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	fencetest.Run(t, fencetest.Config{
		// A take answered past its deadline gives no lease (MinTTL leaves
		// 7.9 ms): Acquire may refuse a lease of MinTTL.
		ShortLeaseMayFail: true,
		New: func(t testing.TB) fence.Locker {
			return newLocker(t, endpoints, &etcdlock.Options{WatchdogTTL: watchdogTTL})
		},
		Remove: func(t testing.TB, name string) {
			removeHolder(t, admin, name)
		},
		NewObserved: func(t testing.TB, obs fence.Observer) fence.Locker {
			return newLocker(t, endpoints, &etcdlock.Options{WatchdogTTL: watchdogTTL, Observer: obs})
		},
		NewLogged: func(t testing.TB, log *slog.Logger) fence.Locker {
			return newLocker(t, endpoints, &etcdlock.Options{WatchdogTTL: watchdogTTL, Logger: log})
		},
		NewClosable: func(t testing.TB) (fence.Locker, func()) {
			c := newClient(t, endpoints, nil)
			l, err := etcdlock.New(c, &etcdlock.Options{WatchdogTTL: watchdogTTL})
			if err != nil {
				t.Fatal(err)
			}
			return l, func() { _ = c.Close() }
		},
		WatchdogTTL: watchdogTTL,
	})
}

// removeHolder deletes the holder's key of the lock called name (the
// oldest under its prefix), as an operator would with etcdctl del.
func removeHolder(t testing.TB, c *clientv3.Client, name string) {
	t.Helper()
	l, err := etcdlock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 10*time.Second)
	resp, err := c.Get(ctx, l.Prefix(name), clientv3.WithFirstCreate()...)
	if err != nil {
		t.Fatalf("remove %q: %v", name, err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("remove %q: no holder", name)
	}
	if _, err := c.Delete(ctx, string(resp.Kvs[0].Key)); err != nil {
		t.Fatalf("remove %q: %v", name, err)
	}
}
