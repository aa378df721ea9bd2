package etcdlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/observetest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// revokeCutCounter counts the LeaseRevokes sent through a hangGate behind it:
// those that reached it, and those it cut (their attempt timed out while
// the member hung).
type revokeCutCounter struct {
	sent, cut atomic.Int64
}

func (r *revokeCutCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method != "/etcdserverpb.Lease/LeaseRevoke" {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	r.sent.Add(1)
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err != nil && ctx.Err() != nil {
		r.cut.Add(1)
	}
	return err
}

// revokeCutLocker is hungLocker with a revokeCutCounter before its gate,
// returned too.
func revokeCutLocker(t *testing.T) (*etcdlock.Locker, *clientv3.Client, *hangGate, *revokeCutCounter) {
	t.Helper()
	g := &hangGate{}
	t.Cleanup(g.resume)
	rc := &revokeCutCounter{}
	c := dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(rc.intercept, g.intercept))
	l, err := etcdlock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l, c, g, rc
}

// waitCount waits, up to 10 s, for n to reach at least want.
func waitCount(t *testing.T, n *atomic.Int64, want int64, what string) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); n.Load() < want; {
		if time.Now().After(end) {
			t.Fatalf("%s: %d, want %d, 10 s later:\n%s", what, n.Load(), want, observetest.Stacks())
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// closeDuringFirstRevoke acquires a lease of 30 s on a Locker whose member
// hangs after the Acquire, has lose end it in a way that sends the revoke
// of its etcd lease from the background (its first attempt), calls
// Locker.Close while that revoke is under way and closes the client as
// Close returns, as a user does, then lets the member answer again once
// the revoke's first attempt was cut. It fails the test unless Close
// waited for that revoke (and its retry): the client's close cut it
// otherwise, and the key held the lock for nobody until its etcd lease
// expired.
func closeDuringFirstRevoke(t *testing.T, lose func(*etcdlock.Locker, fence.Lease)) {
	l, c, g, rc := revokeCutLocker(t)
	admin := newClient(t, shared.Endpoints(), nil)
	// Left for its etcd lease's TTL if the revoke is cut: deleted for the
	// next run (-count).
	t.Cleanup(func() { _, _ = admin.Delete(context.Background(), l.Prefix(t.Name()), clientv3.WithPrefix()) })
	etcdlock.HoldRuns(l)
	lease := acquire(t, l, t.Name(), 30*time.Second)
	g.hang()
	lose(l, lease)
	waitCount(t, &rc.sent, 1, "revokes sent")
	closed := make(chan error, 1)
	go func() {
		err := l.Close(ctxFor(t, 10*time.Second))
		_ = c.Close()
		closed <- err
	}()
	waitCount(t, &rc.cut, 1, "revokes cut")
	g.resume()
	wantClosed(t, closed, "Locker.Close")
	waitNoKeys(t, admin, l.Prefix(t.Name()), 5*time.Second)
}

// Err on a lease past its deadline (before its run saw it: "on lease
// lost, shut down") ends it and sends the revoke of its etcd lease from a
// goroutine, so as not to wait for etcd. That revoke was not counted for
// Locker.Close until its first attempt had failed and it was left to be
// retried: Close, called meanwhile, returned nil at once, the client's
// close cut the revoke, and once the member answered again the key stayed
// ("1 keys still under ... 5s later"), holding the lock for nobody until
// its etcd lease expired (30 s). Close must wait for it, as for a retry.
func TestCloseWaitsForErrsRevoke(t *testing.T) {
	closeDuringFirstRevoke(t, func(_ *etcdlock.Locker, lease fence.Lease) {
		etcdlock.PassDeadline(t, lease)
		if err := lease.Err(); !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Err past the deadline = %v, want ErrLeaseLost", err)
		}
	})
}

// A lease's run ends it at its deadline and revokes its etcd lease, which
// holds the key. That revoke's first attempt, sent by run, was not counted
// for Locker.Close, only its retries: a Close called during it returned
// nil at once, the client's close cut the revoke, and once the member
// answered again the key stayed ("1 keys still under ... 5s later"),
// holding the lock for nobody until its etcd lease expired (30 s).
func TestCloseWaitsForRunsRevoke(t *testing.T) {
	closeDuringFirstRevoke(t, func(_ *etcdlock.Locker, lease fence.Lease) {
		etcdlock.Soon(t, lease, 0)
	})
}
