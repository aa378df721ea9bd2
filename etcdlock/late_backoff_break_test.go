package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// TestLateTakesBackOff: every create Txn's reply is held 15 ms, longer than
// a lease of fence.MinTTL, so every take is answered past the lease's
// deadline and given back (its etcd lease revoked). An Acquire with a 1 s
// budget tries again until the budget ends; each try again is a Grant, a
// Txn and a Revoke, three Raft commits, on a cluster already too slow, and
// it made them at once, one round after another.
func TestLateTakesBackOff(t *testing.T) {
	const wait = time.Second
	var txns atomic.Int64
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   shared.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if method == "/etcdserverpb.KV/Txn" {
					txns.Add(1)
					tm := time.NewTimer(15 * time.Millisecond)
					<-tm.C
				}
				return err
			})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	l, err := etcdlock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ls, err := l.Acquire(ctxFor(t, 30*time.Second), t.Name(), fence.TTL(fence.MinTTL), fence.Wait(wait))
	took := time.Since(start)
	if ls != nil {
		_ = ls.Release(context.Background())
		t.Fatalf("Acquire returned a lease, Err %v", ls.Err())
	}
	if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "too late") {
		t.Fatalf("Acquire = %v, want ErrNotAcquired saying the reply came too late", err)
	}
	n := txns.Load()
	t.Logf("Acquire after %v, %d create Txns: %v", took.Round(time.Millisecond), n, err)
	if took < wait-100*time.Millisecond || took > wait+time.Second {
		t.Errorf("Acquire with a %v budget returned after %v", wait, took.Round(time.Millisecond))
	}
	if n > 20 {
		t.Errorf("%d create Txns in a %v budget, every one answered too late: no back-off between them", n, wait)
	}
}
