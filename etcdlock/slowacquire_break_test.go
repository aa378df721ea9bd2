package etcdlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// A watchdog lease whose Acquire took most of its lease time: the cluster
// stalled, and the create Txn's replies were lost four times (each attempt
// cut after a sixth of the lease time, then sent again), the Txn applied
// by the first. Its deadline is measured from before the Grant was sent,
// two thirds of the lease time back; the watchdog must renew it before
// then, not a third of the lease time after the Acquire returned, past the
// deadline: the lease was lost a second after it was granted, on a healthy
// cluster, without a renewal ever being tried.
func TestSlowAcquireRenewedInTime(t *testing.T) {
	var stalls atomic.Int64
	c := stallingClient(t, shared.Endpoints(), &stalls)
	const ttl = 3 * time.Second // attempts of 500 ms, renewals every second
	l, err := etcdlock.New(c, &etcdlock.Options{WatchdogTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	stalls.Store(4)
	start := time.Now()
	lease, err := l.Acquire(ctxFor(t, 30*time.Second), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background()) //nolint:errcheck // checked below
	t.Logf("acquired after %v; deadline %v after the start", time.Since(start), lease.Deadline().Sub(start))
	select {
	case <-lease.Done():
		t.Fatalf("the watchdog lease ended %v after its Acquire began, on a healthy cluster: %v",
			time.Since(start), lease.Err())
	case <-time.After(2 * ttl):
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// stallingClient returns a client of endpoints that loses the reply of its
// next n Txns, n read from stalls as they are sent (the Txn is applied; the
// attempt waits until its context ends), closed in t.Cleanup.
func stallingClient(t *testing.T, endpoints []string, stalls *atomic.Int64) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if method == "/etcdserverpb.KV/Txn" && stalls.Add(-1) >= 0 {
					<-ctx.Done() // the reply is lost: the attempt's timer cuts it
					return ctx.Err()
				}
				return err
			})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The same for Extend: a watchdog lease extended on a stalled cluster, its
// move Txn's replies lost four times, the move applied by the first. The
// new deadline is measured from before the new etcd lease's Grant was
// sent; the watchdog must renew the new etcd lease before it, not a third
// of the lease time after Extend returned.
func TestSlowExtendRenewedInTime(t *testing.T) {
	var stalls atomic.Int64
	c := stallingClient(t, shared.Endpoints(), &stalls)
	const ttl = 3 * time.Second // attempts of 500 ms, renewals every second
	l, err := etcdlock.New(c, &etcdlock.Options{WatchdogTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 30*time.Second)
	lease, err := l.Acquire(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background()) //nolint:errcheck // checked below
	stalls.Store(4)
	start := time.Now()
	if err := lease.Extend(ctx, ttl); err != nil {
		t.Fatal(err)
	}
	t.Logf("extended after %v; deadline %v after the start", time.Since(start), lease.Deadline().Sub(start))
	select {
	case <-lease.Done():
		t.Fatalf("the watchdog lease ended %v after its Extend began, on a healthy cluster: %v",
			time.Since(start), lease.Err())
	case <-time.After(2 * ttl):
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}
