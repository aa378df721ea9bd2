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
	"github.com/fencekit/fence/memlock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// delayingClient returns a client of endpoints that holds the reply of
// its next `delays` Txns until a lease of ttl, taken once the Txn was
// applied, has run out: the reply comes more than ttl after the etcd
// lease's Grant was sent.
func delayingClient(t *testing.T, endpoints []string, delays *atomic.Int64, ttl time.Duration) *clientv3.Client {
	t.Helper()
	probe, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if method == "/etcdserverpb.KV/Txn" && err == nil && delays.Add(-1) >= 0 {
					pl, perr := probe.Acquire(context.Background(), "probe", fence.TTL(ttl))
					if perr == nil {
						<-pl.Done()
					}
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

// A create Txn that took the free lock but whose reply came more than the
// lease time after the etcd lease's Grant was sent (a stalled member, a
// slow network) gave a lease already past its deadline. Now a try-once
// Acquire fails with ErrNotAcquired saying the reply came too late, its
// etcd lease revoked (the lock free at once), and one with a wait budget
// tries again on a new etcd lease and gets a live lease.
func TestLateTake(t *testing.T) {
	const ttl = time.Second
	for _, wait := range []time.Duration{0, 10 * time.Second} {
		t.Run("wait="+wait.String(), func(t *testing.T) {
			var delays atomic.Int64
			l, err := etcdlock.New(delayingClient(t, shared.Endpoints(), &delays, ttl), nil)
			if err != nil {
				t.Fatal(err)
			}
			name := t.Name()
			delays.Store(1)
			lease, err := l.Acquire(ctxFor(t, 30*time.Second), name, fence.TTL(ttl), fence.Wait(wait))
			if lease != nil {
				defer lease.Release(context.Background()) //nolint:errcheck // the verdict is on Err and Deadline
			}
			if wait == 0 {
				if lease != nil {
					t.Fatalf("Acquire whose reply came late returned a lease, deadline %v ago, Err = %v", time.Since(lease.Deadline()).Round(time.Millisecond), lease.Err())
				}
				if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, fence.ErrLeaseLost) || !strings.Contains(err.Error(), "too late") {
					t.Fatalf("Acquire = %v, want ErrNotAcquired saying the reply came too late", err)
				}
				t.Logf("Acquire: %v", err)
				other, err := newLocker(t, shared.Endpoints(), nil).Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(ttl))
				if err != nil {
					t.Fatalf("after the late take was given back: %v", err)
				}
				_ = other.Release(ctxFor(t, 10*time.Second))
				return
			}
			if err != nil {
				t.Fatalf("Acquire with %v to wait after a late take: %v", wait, err)
			}
			if !time.Now().Before(lease.Deadline()) || lease.Err() != nil {
				t.Fatalf("Acquire returned a lease already ended: deadline %v ago, Err = %v", time.Since(lease.Deadline()).Round(time.Millisecond), lease.Err())
			}
		})
	}
}
