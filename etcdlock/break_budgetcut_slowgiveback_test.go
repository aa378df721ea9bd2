package etcdlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/memlock"
	"google.golang.org/grpc"
)

// TestLateFirstTakeSlowGiveBackBeforeReturn: an Acquire with a wait budget
// shorter than the lease time whose first try (on ctx alone, doc.go) takes
// the lock with a reply past the lease's deadline, so past the budget too,
// gives the take back and fails saying the reply came too late and that
// the lock was "given back". The member answers, slowly: a revoke takes
// 200 ms (a cluster across regions; the very slowness that made the reply
// late). The caller's ctx has seconds left. Before 6637dab the give-back
// was waited for up to half a second within ctx, and the key was gone
// when Acquire returned; since, it is bounded by the budget, already over
// (the first try ran past it on ctx alone), so by doneGrace (100 ms): the
// revoke is cancelled before it gets through, Acquire returns with the
// lock held for nobody, and the revoke is left to a retry in the
// background. redislock waits for that give-back until the budget ends
// but at least 250 ms after the late reply (README; 174c5c1,
// TestLateTakePastBudgetGivenBackBeforeReturn).
func TestLateFirstTakeSlowGiveBackBeforeReturn(t *testing.T) {
	const ttl, wait, revokeRTT = time.Second, 300 * time.Millisecond, 200 * time.Millisecond
	probe, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	var armed, slow atomic.Bool
	late := make(chan time.Time, 1)
	cl := dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if method == "/etcdserverpb.Lease/LeaseRevoke" && slow.Load() {
				// The request takes revokeRTT to get there (and is not
				// sent if cancelled on its way).
				tm := time.NewTimer(revokeRTT)
				select {
				case <-tm.C:
				case <-ctx.Done():
					tm.Stop()
					return ctx.Err()
				}
			}
			err := invoker(ctx, method, req, reply, cc, opts...)
			if method == "/etcdserverpb.KV/Txn" && err == nil && armed.CompareAndSwap(true, false) {
				// Applied: hold the reply until a lease time has run out
				// since, past the lease's deadline and the budget.
				if pl, perr := probe.Acquire(context.Background(), "probe", fence.TTL(ttl)); perr == nil {
					<-pl.Done()
				}
				slow.Store(true)
				late <- time.Now()
			}
			return err
		}))
	l, err := etcdlock.New(cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	admin := newClient(t, shared.Endpoints(), nil)
	armed.Store(true)
	start := time.Now()
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(ttl), fence.Wait(wait))
	took := time.Since(start)
	left := countKeys(t, admin, l.Prefix(t.Name()))
	if lease != nil {
		_ = lease.Release(ctxFor(t, 5*time.Second))
		t.Fatalf("Acquire with a late reply returned a lease")
	}
	var at time.Time
	select {
	case at = <-late:
	default:
		t.Fatalf("the create Txn was never answered late (Acquire = %v)", err)
	}
	t.Logf("late reply %v after the start; Acquire = %v after %v", at.Sub(start).Round(time.Millisecond), err, took.Round(time.Millisecond))
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Acquire = %v, want ErrNotAcquired and ErrLeaseLost (the reply came too late)", err)
	}
	if left != 0 {
		t.Errorf("Acquire returned %v after the late reply, the take given back, its key still there (a revoke takes %v; ctx had seconds left): the lock held for nobody", start.Add(took).Sub(at).Round(time.Millisecond), revokeRTT)
	}
	// The background retry frees it at last.
	for end := time.Now().Add(10 * time.Second); countKeys(t, admin, l.Prefix(t.Name())) > 0; {
		if time.Now().After(end) {
			t.Fatal("the key is still there 10 s later")
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}
