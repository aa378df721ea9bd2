package etcdlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWaiterCreateUnavailableKeepsPlace: the only member applies a
// waiter's create Txn and is killed before it replies, then restarted
// from its data dir (as in TestStandaloneRestartLosesNothing on a loaded
// machine, ci83); the reply is lost with the connection (gRPC's
// Unavailable, "error reading from server: EOF"). The waiter must keep its
// place within its Wait budget: send the Txn again once the member is
// back, find its key made by the first, wait in line, and take the lock
// once the holder releases, with the token of that key. Before, Acquire
// gave up at once with "etcdlock: create ...: rpc error: code =
// Unavailable desc = error reading from server: EOF" while the lock was
// held: clientv3 sends a write again only if it never went out.
func TestWaiterCreateUnavailableKeepsPlace(t *testing.T) {
	c := etcdtest.Start(t)
	m := c.Members[0]
	endpoints := c.Endpoints()
	ctx := ctxFor(t, 30*time.Second)
	name := t.Name()
	holder, err := newLocker(t, endpoints, nil).Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Release(ctx) }()
	var armed atomic.Bool
	lost := make(chan int64, 1) // the revision the lost reply created the key at
	restarted := make(chan struct{})
	cl := dialClient(t, endpoints, grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if method == "/etcdserverpb.KV/Txn" && err == nil && armed.CompareAndSwap(true, false) {
				lost <- reply.(*pb.TxnResponse).Header.Revision
				<-restarted
				return status.Error(codes.Unavailable, "error reading from server: EOF")
			}
			return err
		}))
	l, err := etcdlock.New(cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	got := make(chan fence.Lease, 1)
	failed := make(chan error, 1)
	go func() {
		next, err := l.Acquire(ctx, name, fence.Wait(20*time.Second))
		if err != nil {
			failed <- err
			return
		}
		got <- next
	}()
	var created int64
	select {
	case created = <-lost:
	case err := <-failed:
		t.Fatalf("the waiter returned before its create Txn was answered: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no create Txn 10 s after Acquire")
	}
	// Restarted here, not in the interceptor: a WaitReady between the
	// restart's kill and its launch reads the killed process's exit and
	// fails ("exited before serving").
	err = m.Restart()
	close(restarted)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.WaitReady(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-failed:
		t.Fatalf("waiter: %v", err)
	case next := <-got:
		defer func() { _ = next.Release(ctx) }()
		// Its place: the key the lost reply made, whose create revision
		// is greater than the holder's token.
		if tok := int64(next.Token()); tok != created || tok <= int64(holder.Token()) {
			t.Errorf("waiter's token %d; want %d, the create revision of the key made by the Txn whose reply was lost (holder's token %d)", tok, created, holder.Token())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter has not taken the lock 10 s after the release")
	}
}
