package etcdlock_test

import (
	"context"
	"strconv"
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

// newClient returns a client of endpoints, closed in t.Cleanup. If kv is
// not nil, it counts the client's KV calls (Range, Txn, Put, ...).
func newClient(t testing.TB, endpoints []string, kv *atomic.Int64) *clientv3.Client {
	t.Helper()
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	}
	if kv != nil {
		cfg.DialOptions = []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if strings.HasPrefix(method, "/etcdserverpb.KV/") {
					kv.Add(1)
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			})}
	}
	return dial(t, cfg)
}

// dialClient returns a client of endpoints with opts (interceptors),
// closed in t.Cleanup.
func dialClient(t testing.TB, endpoints []string, opts ...grpc.DialOption) *clientv3.Client {
	t.Helper()
	return dial(t, clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), DialOptions: opts})
}

func dial(t testing.TB, cfg clientv3.Config) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newLocker returns a Locker on its own client of endpoints.
func newLocker(t testing.TB, endpoints []string, o *etcdlock.Options) *etcdlock.Locker {
	t.Helper()
	l, err := etcdlock.New(newClient(t, endpoints, nil), o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// freshName is a lock name of t's own in this run: t.Name() with a
// suffix, for tests that leave a key behind on the shared server (a client
// closed while it held or waited), so that -count=2 does not find it.
func freshName(t testing.TB) string {
	return t.Name() + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// leaseID is the etcd lease a lease's key was created with: the key's last
// element, in hexadecimal.
func leaseID(t testing.TB, lease fence.Lease) clientv3.LeaseID {
	t.Helper()
	key := lease.(*etcdlock.Lease).Key()
	id, err := strconv.ParseInt(key[strings.LastIndexByte(key, '/')+1:], 16, 64)
	if err != nil {
		t.Fatalf("lease key %q: %v", key, err)
	}
	return clientv3.LeaseID(id)
}

// waitDone waits for lease to end, failing the test after limit, and
// returns how long it took.
func waitDone(t testing.TB, lease fence.Lease, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-lease.Done():
		return time.Since(start)
	case <-time.After(limit):
		t.Fatalf("lease %q still held %v later", lease.Name(), limit)
		return 0
	}
}
