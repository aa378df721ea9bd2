package etcdlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"google.golang.org/grpc"
)

// TestRetriedReleaseAfterLeaseRevokedIsLost: the holder's etcd lease is
// revoked behind its back (etcdctl lease revoke; the same as an etcd lease
// that expired while the holder's renewals hung) and another Locker takes
// the lock, while the holder's watch delivers nothing (a member that
// hangs; see deafWatchClient). The holder's Release fails (its ctx done)
// and its revoke gets ErrLeaseNotFound at once: proof that the etcd lease
// was gone before the Locker revoked anything. The Release that retries,
// finding the key gone, must say ErrLeaseLost (a mark set as the revoke
// was sent, for a while, made it say nil: a Release that vouched for a
// lease another owner held the lock during). (Unlike
// TestRetriedReleaseAfterLossNotReleased, skipped as a design call, the
// failed Release here has the answer in hand.)
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

// TestRetriedReleaseAfterExpiryDuringGiveBackIsLost: as
// TestRetriedReleaseAfterLeaseRevokedIsLost, but the failed Release's
// revoke cannot get through (the member hangs: an interceptor fails it),
// and is retried in the background; meanwhile the holder's etcd lease is
// gone (revoked here, as one that expired while the cluster was cut off)
// and another Locker takes the lock. Once revokes get through, the
// background retry finds the etcd lease gone: that is no revoke of ours,
// and the Release that retries, finding the key gone, must say
// ErrLeaseLost.
func TestRetriedReleaseAfterExpiryDuringGiveBackIsLost(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	var failing atomic.Bool
	l, err := etcdlock.New(deafWatchClient(t, endpoints, grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if method == "/etcdserverpb.Lease/LeaseRevoke" && failing.Load() {
				return context.DeadlineExceeded // as a revoke to a member that hangs
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		})), nil)
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
	failing.Store(true)
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := lease.Release(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release with a done ctx = %v, want context.Canceled", err)
	}
	if _, err := admin.Revoke(ctx, leaseID(t, lease)); err != nil {
		t.Fatal(err)
	}
	got, err := other.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("the lock was not free after the holder's etcd lease was revoked: %v", err)
	}
	defer got.Release(ctx)
	failing.Store(false)
	waitGiveBacks(t, 0, 10*time.Second) // the retry found the etcd lease gone
	if err := lease.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release retried after the holder's etcd lease expired while its revoke was retried, and another took the lock = %v, want ErrLeaseLost", err)
	}
}
