package etcdlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
	"github.com/fencekit/fence/memlock"
	"google.golang.org/grpc"
)

// TestLateTakeRetryHungWithinBudget: an Acquire with a wait budget whose
// first try takes the lock with a reply that comes past the lease's
// deadline (held here until a lease time after the create Txn was
// applied) gives the take back and tries again, on a new etcd lease,
// within its budget (doc.go). The only member hangs (paused) as that late
// reply arrives, so the give-back's revoke and the try again's Grant hang
// too. The budget bounds every try but the first (README; redislock's
// giveBackLate, 44610fb): Acquire must return by about the budget. It ran
// the try again on the caller's ctx alone, and held Acquire until that
// ended (8 s with a 2 s budget); the give-back of the late take, bounded
// by the caller's ctx only, added up to half a second past the budget.
func TestLateTakeRetryHungWithinBudget(t *testing.T) {
	const ttl, wait, ctxLimit, margin = time.Second, 2 * time.Second, 8 * time.Second, 600 * time.Millisecond
	c := etcdtest.Start(t)
	m := c.Members[0]
	resume := func() {} // once paused (below), lets the member go on

	probe, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	paused := make(chan time.Time, 1)
	cl := dialClient(t, c.Endpoints(), grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if method == "/etcdserverpb.KV/Txn" && err == nil && armed.CompareAndSwap(true, false) {
				// Applied: hold the reply until a lease time has run
				// out since (so past the deadline counted from the
				// Grant), and pause the member as it goes out.
				if pl, perr := probe.Acquire(context.Background(), "probe", fence.TTL(ttl)); perr == nil {
					<-pl.Done()
				}
				resume = pauseMember(t, m)
				paused <- time.Now()
			}
			return err
		}))
	defer func() { resume() }()
	l, err := etcdlock.New(cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	ctx := ctxFor(t, ctxLimit)
	start := time.Now()
	lease, err := l.Acquire(ctx, t.Name(), fence.TTL(ttl), fence.Wait(wait))
	took := time.Since(start)
	if lease != nil {
		t.Fatalf("Acquire on a paused member returned a lease (Err %v)", lease.Err())
	}
	select {
	case at := <-paused:
		t.Logf("late reply and pause %v after the start; Acquire = %v after %v (budget %v, ctx %v)", at.Sub(start).Round(time.Millisecond), err, took.Round(time.Millisecond), wait, ctxLimit)
	default:
		t.Fatalf("the create Txn was never answered late (Acquire = %v after %v)", err, took)
	}
	if took > wait+margin {
		t.Errorf("Acquire with a %v budget returned %v after it (%v in all): the try after the late take ran past the budget", wait, (took - wait).Round(time.Millisecond), took.Round(time.Millisecond))
	}
	resume()
	nameFreedOnResume(t, l, newClient(t, c.Endpoints(), nil))
}
