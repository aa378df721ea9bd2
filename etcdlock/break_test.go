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

// txnHook is called, when set, after each Txn the hooked client sends,
// with the invoker's error; it returns the error the caller gets.
type txnHook struct {
	f atomic.Pointer[func(error) error]
}

func (h *txnHook) set(f func(error) error) { h.f.Store(&f) }

// hookedClient is a client of endpoints whose Txn replies go through h.
func hookedClient(t testing.TB, endpoints []string, h *txnHook) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if f := h.f.Load(); f != nil && strings.HasSuffix(method, "/Txn") {
					return (*f)(err)
				}
				return err
			})},
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// An Extend whose Txn moved the key to the new etcd lease but whose reply
// was lost (the caller's ctx ended, the connection dropped) must not revoke
// that new etcd lease: it now carries the key, and revoking it deletes the
// lock the caller still holds.
func TestExtendReplyLostKeepsLock(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	var h txnHook
	l, err := etcdlock.New(hookedClient(t, endpoints, &h), nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	var once atomic.Bool
	h.set(func(err error) error {
		if err == nil && once.CompareAndSwap(false, true) {
			return context.DeadlineExceeded // applied, reply lost
		}
		return err
	})
	err = lease.Extend(ctxFor(t, 10*time.Second), time.Minute)
	h.set(func(err error) error { return err })
	t.Logf("Extend with its reply lost = %v", err)
	key := lease.(*etcdlock.Lease).Key()
	resp, gerr := admin.Get(ctxFor(t, 10*time.Second), key)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("Extend whose reply was lost deleted the lock's key (lease Err %v)", lease.Err())
	}
	if lease.Err() != nil {
		t.Fatalf("lease ended: %v", lease.Err())
	}
	// Whatever Extend said, the key's etcd lease is the one renewed and
	// revoked by the lease: Release leaves nothing behind.
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, admin, l.Prefix(t.Name())); n != 0 {
		t.Fatalf("%d keys left after Release", n)
	}
}

// An Extend still in flight when the lease reaches its deadline must not
// report success for the lease that has ended, nor leave the key on the new
// etcd lease, blocking the lock for the new TTL.
func TestExtendRacingDeadline(t *testing.T) {
	endpoints := shared.Endpoints()
	var h txnHook
	l, err := etcdlock.New(hookedClient(t, endpoints, &h), nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	// The Extend's Txn is answered only once the lease has ended at its
	// deadline: the reply was slow.
	h.set(func(err error) error {
		select {
		case <-lease.Done():
		case <-time.After(10 * time.Second):
		}
		return err
	})
	err = lease.Extend(ctxFor(t, 20*time.Second), time.Minute)
	h.set(func(err error) error { return err })
	if lease.Err() == nil {
		t.Fatal("lease did not end at its deadline")
	}
	if err == nil {
		t.Errorf("Extend = nil for a lease that ended meanwhile (Err %v)", lease.Err())
	} else if !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Extend = %v, want ErrLeaseLost", err)
	}
	// The lock is free: nobody holds the key.
	other, err := newLocker(t, endpoints, nil).Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.Wait(2*time.Second))
	if err != nil {
		t.Fatalf("the lock is still held after its lease ended: %v", err)
	}
	if err := other.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A user who closes the client while a lease is held: the lease ends at
// once (nothing can renew it or watch its key any more), without a panic,
// and Release reports it lost.
func TestClientClosedWhileHeld(t *testing.T) {
	endpoints := shared.Endpoints()
	c := newClient(t, endpoints, nil)
	l, err := etcdlock.New(c, nil) // watchdog: 30 s
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	took := waitDone(t, lease, 5*time.Second)
	t.Logf("lease ended %v after the client was closed: %v", took, lease.Err())
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", lease.Err())
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release = %v, want ErrLeaseLost", err)
	}
	if _, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name()); !errors.Is(err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire on a closed client = %v, want ErrNotAcquired", err)
	}
}

func countKeys(t testing.TB, c *clientv3.Client, prefix string) int64 {
	t.Helper()
	resp, err := c.Get(ctxFor(t, 10*time.Second), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// A waiter whose client the user closes gives up at once with an error,
// and is not granted the lock.
func TestClientClosedWhileWaiting(t *testing.T) {
	endpoints := shared.Endpoints()
	holder, err := newLocker(t, endpoints, nil).Acquire(ctxFor(t, 10*time.Second), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(context.Background())
	c := newClient(t, endpoints, nil)
	l, err := etcdlock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctxFor(t, 30*time.Second), t.Name(), fence.Wait(20*time.Second))
		errc <- err
	}()
	admin := newClient(t, endpoints, nil)
	for end := time.Now().Add(10 * time.Second); countKeys(t, admin, l.Prefix(t.Name())) < 2; {
		if time.Now().After(end) {
			t.Fatal("no waiter's key after 10 s")
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		t.Logf("waiter on a closed client: %v", err)
		if !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("waiter on a closed client = %v, want ErrNotAcquired", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter on a closed client still waiting after 5 s")
	}
}
