package etcdlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence/etcdlock"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
)

// noLeader is a client interceptor that, while on, answers every Txn at
// once with etcd's "no leader" (a member during an election), and turns
// itself off once it has answered left of them sent past after.
type noLeader struct {
	mu    sync.Mutex
	on    bool
	after time.Time // zero: answers for as long as it is on
	left  int       // answers still to give past after
}

func (n *noLeader) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method == "/etcdserverpb.KV/Txn" {
		n.mu.Lock()
		on := n.on
		if on && !n.after.IsZero() && time.Now().After(n.after) {
			if n.left--; n.left <= 0 {
				n.on = false
			}
		}
		n.mu.Unlock()
		if on {
			return rpctypes.ErrGRPCNoLeader
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// An Extend whose move is answered "no leader" from the start (an
// election) settles it while its ctx lasts, and for a grace after: the
// grace counted from the settle's start, which was the move's first
// answer, so it had passed by the time ctx ended, and the first answer
// after that ended the lease as lost though its key never moved. The
// election ends after three more answers past the ctx's deadline (within
// a few tenths of a second): the settle must still be trying, and find
// the key in place.
func TestSettleGraceCountsFromCtxEnd(t *testing.T) {
	n := &noLeader{}
	l, err := etcdlock.New(dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(n.intercept)), nil)
	if err != nil {
		t.Fatal(err)
	}
	lease := acquire(t, l, t.Name(), 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	dl, _ := ctx.Deadline()
	n.mu.Lock()
	n.on, n.after, n.left = true, dl, 3
	n.mu.Unlock()
	err = lease.Extend(ctx, time.Minute)
	t.Logf("Extend through an election = %v, %v past its ctx's deadline", err, time.Since(dl).Round(time.Millisecond))
	waitSettled(t, l, 5*time.Second)
	if err := lease.Err(); err != nil {
		t.Fatalf("lease Err = %v once the election ended within the settle's grace, its key in place", err)
	}
	if err := lease.Release(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}
