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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWaiterLeaseExpiresWhileQueued: a waiter whose renewals stop getting
// through (its client's keep-alive stream fails; everything else works)
// has its etcd lease expire on the server while it waits in line. It gets
// an error matching fence.ErrLeaseLost, never the lock, within about the
// TTL; the holder is untouched, and when it releases the lock goes to the
// next waiter, whose token is greater.
func TestWaiterLeaseExpiresWhileQueued(t *testing.T) {
	endpoints := shared.Endpoints()
	var cut atomic.Bool
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(
			func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				if cut.Load() && strings.HasSuffix(method, "/LeaseKeepAlive") {
					return nil, status.Error(codes.Unavailable, "test: keep-alives cut")
				}
				return streamer(ctx, desc, cc, method, opts...)
			})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	const ttl = 3 * time.Second
	waiterLocker, err := etcdlock.New(client, &etcdlock.Options{WatchdogTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	l := newLocker(t, endpoints, nil)
	name := t.Name()
	ctx := ctxFor(t, 60*time.Second)
	holder, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cut.Store(true)
	start := time.Now()
	lease, err := waiterLocker.Acquire(ctx, name, fence.Wait(30*time.Second))
	took := time.Since(start)
	if err == nil {
		_ = lease.Release(ctx)
		t.Fatal("the waiter whose etcd lease expired got the lock")
	}
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("waiter = %v; want ErrNotAcquired and ErrLeaseLost", err)
	}
	if took > 3*ttl {
		t.Errorf("the waiter returned %v after it started, with a %v etcd lease", took, ttl)
	}
	t.Logf("waiter: %v after %v", err, took)
	if holder.Err() != nil {
		t.Fatalf("holder: %v", holder.Err())
	}
	next := make(chan error, 1)
	go func() {
		ls, err := l.Acquire(ctx, name, fence.Wait(20*time.Second))
		if err == nil {
			if ls.Token() <= holder.Token() {
				err = errors.New("token did not grow")
			}
			_ = ls.Release(ctx)
		}
		next <- err
	}()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-next; err != nil {
		t.Errorf("next waiter: %v", err)
	}
}
