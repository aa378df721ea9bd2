package etcdlock_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// sentWatch closes sent once a write goes out on the client's connection
// after a call of method was made while armed: with the only member
// paused, nothing else is written, so that write is the call's request,
// now in the member's socket.
type sentWatch struct {
	method string
	armed  atomic.Bool
	called atomic.Bool
	once   sync.Once
	sent   chan struct{}
}

type sentConn struct {
	net.Conn
	w *sentWatch
}

func (c sentConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err == nil && n > 0 && c.w.called.Load() {
		c.w.once.Do(func() { close(c.w.sent) })
	}
	return n, err
}

// sentWatchClient is a client of endpoints whose requests of method, made
// while w is armed, close w.sent once written; closed in t.Cleanup.
func sentWatchClient(t testing.TB, endpoints []string, w *sentWatch) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
				if err != nil {
					return nil, err
				}
				return sentConn{conn, w}, nil
			}),
			grpc.WithChainUnaryInterceptor(
				func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
					if method == w.method && w.armed.Load() {
						w.called.Store(true)
					}
					return invoker(ctx, method, req, reply, cc, opts...)
				}),
		},
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestCancelledCreateGivenBack: an Acquire whose create Txn went out to
// the only member, paused, is cancelled (context.Canceled, well before any
// deadline). The Txn sits in the member's socket and may be applied when
// it resumes, creating the key on an etcd lease nobody keeps alive: the
// lock would be held by nobody for the etcd lease's TTL (a minute here).
// The Locker must give it back (revoke the etcd lease) even though its own
// revoke could not get through while the member was paused: another
// Locker must get the lock within seconds of the member resuming.
func TestCancelledCreateGivenBack(t *testing.T) { testCancelledGivenBack(t, cancelCreate) }

// TestCancelledWaiterGivenBack: the same for an Acquire waiting in line
// (its key created, behind a holder) when the only member is paused: it is
// cancelled, its revoke cannot get through, and its key must not stay in
// line for its etcd lease's TTL once the member resumes and the holder
// releases.
func TestCancelledWaiterGivenBack(t *testing.T) { testCancelledGivenBack(t, cancelWaiter) }

// TestCancelledReleaseGivenBack: the same for a Release whose delete went
// out to the paused member: cancelled, it fails, and the lock must not stay
// held by nobody for the etcd lease's TTL if the member drops the delete.
func TestCancelledReleaseGivenBack(t *testing.T) { testCancelledGivenBack(t, cancelRelease) }

const (
	cancelCreate = iota
	cancelWaiter
	cancelRelease
)

func testCancelledGivenBack(t *testing.T, what int) {
	c := etcdtest.Start(t)
	m := c.Members[0]
	w := &sentWatch{method: "/etcdserverpb.KV/Txn", sent: make(chan struct{})}
	if what == cancelRelease {
		w.method = "/etcdserverpb.KV/DeleteRange"
	}
	l, err := etcdlock.New(sentWatchClient(t, c.Endpoints(), w), nil)
	if err != nil {
		t.Fatal(err)
	}
	other := newLocker(t, c.Endpoints(), nil)
	admin := newClient(t, c.Endpoints(), nil)
	name, ttl := t.Name(), fence.TTL(time.Minute)
	// A connection up, and an etcd lease kept for the next Acquire (which
	// then sends its create Txn at once).
	warm, err := l.Acquire(ctxFor(t, 10*time.Second), name, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	var holder fence.Lease
	switch what {
	case cancelWaiter:
		holder, err = other.Acquire(ctxFor(t, 10*time.Second), name, ttl)
	case cancelRelease:
		holder, err = l.Acquire(ctxFor(t, 10*time.Second), name, ttl)
	}
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	resumed := false
	defer func() {
		if !resumed {
			m.Cont()
		}
	}()
	switch what {
	case cancelWaiter:
		go func() {
			_, err := l.Acquire(cctx, name, ttl, fence.Wait(time.Minute))
			done <- err
		}()
		for end := time.Now().Add(10 * time.Second); countKeys(t, admin, l.Prefix(name)) < 2; {
			if time.Now().After(end) {
				t.Fatal("no waiter in line after 10 s")
			}
		}
		m.Stop()
	default:
		m.Stop()
		w.armed.Store(true)
		go func() {
			if what == cancelRelease {
				done <- holder.Release(cctx)
				return
			}
			_, err := l.Acquire(cctx, name, ttl)
			done <- err
		}()
		select {
		case <-w.sent:
		case err := <-done:
			t.Fatalf("returned before its request was sent: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s never sent", w.method)
		}
	}
	cancel()
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("still running 5 s after its ctx was cancelled")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	t.Logf("cancelled: %v", err)
	m.Cont()
	resumed = true
	if err := m.WaitReady(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if holder != nil && what != cancelRelease {
		if err := holder.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	lease, err := other.Acquire(ctxFor(t, 10*time.Second), name, ttl, fence.Wait(3*time.Second))
	if err != nil {
		keys, _ := admin.Get(ctxFor(t, 10*time.Second), l.Prefix(name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		t.Fatalf("the lock was not acquirable %v after the member resumed: %v; keys %v", time.Since(start), err, keys.Kvs)
	}
	t.Logf("acquired %v after the member resumed", time.Since(start))
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}
