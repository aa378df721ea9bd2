package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Close whose ctx had ended already (a deferred Close with a request's
// ctx, say) rightly returned at once, saying an Extend was still settling,
// but it also stopped revokes from being retried in the background, as a
// Close does once it has waited for the settles: the settle, giving up
// later (the member hung), could not leave the revoke of the lease's etcd
// lease, which holds the key, to be retried. The Close called again, with
// time to wait, waited for the settle, found no revoke to wait for and
// returned nil; the user's close of the client then left the key holding
// the lock for nobody until its etcd lease expired (30 s here: "1 keys
// still under ... 5s later"). Close may be called again, and waits for
// what is under way then: one that gave up before the settles were through
// must leave their revokes to be retried, for the next Close to wait for.
func TestCloseAgainWaitsForSettlesRevoke(t *testing.T) {
	l, c, gate := hungLocker(t, nil)
	admin := newClient(t, shared.Endpoints(), nil)
	lease := acquire(t, l, t.Name(), 30*time.Second)
	// Left for its etcd lease's TTL if the revoke is cut: deleted for the
	// next run (-count).
	t.Cleanup(func() { _, _ = admin.Delete(context.Background(), l.Prefix(t.Name()), clientv3.WithPrefix()) })
	hangExtend(t, gate, lease)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	err := l.Close(ended)
	t.Logf("Locker.Close with a ctx ended = %v", err)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Locker.Close with a ctx ended, an Extend settling = %v, want ctx's error", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close(ctxFor(t, 10*time.Second)) }()
	waitSettled(t, l, 5*time.Second)
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("lease Err = %v once the settle gave up, want ErrLeaseLost", lease.Err())
	}
	gate.resume()
	select {
	case err := <-closed:
		t.Logf("Locker.Close again = %v", err)
		if err != nil {
			t.Errorf("Locker.Close again = %v, the member answering again", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Locker.Close again still waiting 10 s after the member answered:\n%s", observetest.Stacks())
	}
	if err := c.Close(); err != nil {
		t.Logf("client Close = %v", err)
	}
	waitNoKeys(t, admin, l.Prefix(t.Name()), 5*time.Second)
}
