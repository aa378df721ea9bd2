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

// TestExtendReleasedByCloseDuringMove: Close, its ctx short, released a
// lease whose Extend was moving its key (the move applied, its reply
// held): Close's Release could not wait for the Extend and ended the
// lease as released. The Extend, answered after that, returned the
// lease's Err as it was, fence.ErrReleased alone ('Extend = fence: lease
// released, want an error matching fence.ErrLeaseLost'), where
// fence.Lease promises an error matching ErrLeaseLost once the lock is no
// longer held by the lease, as Extend returns after a Release: a caller
// that tells a lost lease from a failure to retry by ErrLeaseLost went on
// extending.
func TestExtendReleasedByCloseDuringMove(t *testing.T) {
	var holdTxn atomic.Bool
	gate := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	held := make(chan struct{}, 1)
	c := dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method == "/etcdserverpb.KV/Txn" && holdTxn.CompareAndSwap(true, false) {
			held <- struct{}{}
			<-gate
		}
		return err
	}))
	l, err := etcdlock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	admin := newClient(t, shared.Endpoints(), nil)
	ctx := ctxFor(t, 30*time.Second)
	lease, err := l.Acquire(ctx, t.Name(), fence.TTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	holdTxn.Store(true)
	extended := make(chan error, 1)
	go func() { extended <- lease.Extend(ctx, 8*time.Second) }()
	<-held
	cerr := l.Close(ctxFor(t, 200*time.Millisecond))
	t.Logf("Close = %v", cerr)
	if cerr == nil {
		t.Error("Close returned nil with an Extend under way past its ctx")
	}
	if err := lease.Err(); err != fence.ErrReleased {
		t.Fatalf("Err after Close = %v, want fence.ErrReleased", err)
	}
	close(gate)
	err = <-extended
	if !errors.Is(err, fence.ErrLeaseLost) || !errors.Is(err, fence.ErrReleased) {
		t.Errorf("Extend = %v, want an error matching fence.ErrLeaseLost and fence.ErrReleased", err)
	}
	// Close again waits for what the first left: the Extend's revoke of
	// the etcd lease it moved the key to.
	if err := l.Close(ctxFor(t, 10*time.Second)); err != nil {
		t.Errorf("Close again = %v", err)
	}
	if n := countKeys(t, admin, l.Prefix(t.Name())); n != 0 {
		t.Errorf("%d key(s) left after Close", n)
	}
}
