package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

// TestRetriedReleaseAfterLeaseRevokedIsLost: the holder's etcd lease is
// revoked behind its back (etcdctl lease revoke; the same as an etcd lease
// that expired while the holder's renewals hung) and another Locker takes
// the lock, while the holder's watch delivers nothing (a member that
// hangs; see deafWatchClient). The holder's Release fails (its ctx done)
// and its revoke gets ErrLeaseNotFound at once: proof that the etcd lease
// was gone before the Locker revoked anything. Before 952d22e
// revokedOnFail was set only by a revoke that got through, so the
// Release that retries, finding the key gone, said ErrLeaseLost. It is
// now set before the revoke is sent and kept whatever the revoke answers,
// so the retry returns nil: a Release that vouches for a lease another
// owner held the lock during. (Unlike TestRetriedReleaseAfterLossNotReleased,
// skipped as a design call, the failed Release here has the answer in hand.)
func TestRetriedReleaseAfterLeaseRevokedIsLost(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l, err := etcdlock.New(deafWatchClient(t, endpoints), nil)
	if err != nil {
		t.Fatal(err)
	}
	other := newLocker(t, endpoints, nil)
	ctx := ctxFor(t, 30*time.Second)
	name := t.Name()
	lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Revoke(ctx, leaseID(t, lease)); err != nil {
		t.Fatal(err)
	}
	got, err := other.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("the lock was not free after the holder's etcd lease was revoked: %v", err)
	}
	defer got.Release(ctx)
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := lease.Release(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release with a done ctx = %v, want context.Canceled", err)
	}
	if err := lease.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release retried after the holder's etcd lease was revoked and another took the lock = %v, want ErrLeaseLost", err)
	}
}
