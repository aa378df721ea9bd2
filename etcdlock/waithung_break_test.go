package etcdlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// A waiter in line when the only member is paused, with a ctx that never
// ends: its Wait budget must still bound Acquire (the budget ends the
// watches, the renewals and the checks in flight, all on the paused
// member; the revoke of its etcd lease that follows is bounded too), and
// it must give up with ErrHeld, not hang or report the lock taken. The
// waiter is in line once the reply to its create Txn has come: its key
// alone does not say so (the test paused the member once it saw the key,
// which on a loaded machine the member had applied without replying yet,
// and the waiter, not in line, was still sending its create Txn 13 s
// later, ci83: TestWaiterBudgetPausedBeforeCreateReply).
func TestWaiterBudgetOnPausedMember(t *testing.T) {
	c := etcdtest.Start(t)
	m := c.Members[0]
	ctx := ctxFor(t, 30*time.Second)
	holder, err := newLocker(t, c.Endpoints(), nil).Acquire(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	inLine := make(chan struct{})
	var once sync.Once
	l, err := etcdlock.New(dialClient(t, c.Endpoints(), grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if method == "/etcdserverpb.KV/Txn" && err == nil {
				once.Do(func() { close(inLine) }) // the create Txn's reply
			}
			return err
		})), nil)
	if err != nil {
		t.Fatal(err)
	}
	const wait = 3 * time.Second
	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		_, err := l.Acquire(context.Background(), t.Name(), fence.Wait(wait))
		errc <- err
	}()
	select {
	case <-inLine:
	case err := <-errc:
		t.Fatalf("the waiter returned before it was in line: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no waiter in line after 10 s")
	}
	m.Stop()
	paused := time.Now()
	defer func() {
		m.Cont()
		if err := m.WaitReady(10 * time.Second); err != nil {
			t.Error(err)
		}
		_ = holder.Release(ctxFor(t, 10*time.Second))
	}()
	select {
	case err := <-errc:
		t.Logf("waiter: %v, %v after the start, %v after the pause", err, time.Since(start), time.Since(paused))
		if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, fence.ErrHeld) {
			t.Fatalf("waiter = %v, want ErrNotAcquired and ErrHeld", err)
		}
		if took := time.Since(start); took > wait+2*time.Second {
			t.Fatalf("waiter with a budget of %v returned after %v", wait, took)
		}
	case <-time.After(wait + 10*time.Second):
		t.Fatalf("waiter with a budget of %v still waiting %v after the pause", wait, time.Since(paused))
	}
}

// TestWaiterBudgetPausedBeforeCreateReply: the only member is paused
// after it applied a waiter's create Txn and before its reply went out
// (as in TestWaiterBudgetOnPausedMember on a loaded machine, ci83: the key
// was there, so the test paused the member, but the reply had not reached
// the waiter). The waiter, with a budget of 3 s and a ctx that never
// ends, must still return: its create Txn, a try already sent (fence.Wait),
// runs to its reply or its attempt's timeout (a sixth of the lease time,
// 5 s), and is not sent again past the budget. It fails with
// ErrNotAcquired, and its key is gone once the member resumes. Before, the
// create Txn was sent again to the paused member every 5 s for as long as
// ctx lasted: "waiter with a budget of 3s still waiting 12.98s after the
// pause".
func TestWaiterBudgetPausedBeforeCreateReply(t *testing.T) {
	const wait, per = 3 * time.Second, etcdlock.DefaultWatchdogTTL / 6
	c := etcdtest.Start(t)
	m := c.Members[0]
	ctx := ctxFor(t, 30*time.Second)
	holder, err := newLocker(t, c.Endpoints(), nil).Acquire(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	paused := make(chan time.Time, 1)
	cl := dialClient(t, c.Endpoints(), grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if method == "/etcdserverpb.KV/Txn" && err == nil && armed.CompareAndSwap(true, false) {
				// Applied; the member stops before the reply goes out,
				// which never comes.
				m.Stop()
				paused <- time.Now()
				<-ctx.Done()
				return status.FromContextError(ctx.Err()).Err()
			}
			return err
		}))
	l, err := etcdlock.New(cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			m.Cont()
			if err := m.WaitReady(10 * time.Second); err != nil {
				t.Error(err)
			}
			_ = holder.Release(ctxFor(t, 10*time.Second))
		}
	}
	defer resume()
	armed.Store(true)
	start := time.Now()
	errc := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(context.Background(), t.Name(), fence.Wait(wait))
		if lease != nil {
			err = errors.New("got the lock while it was held")
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		took := time.Since(start)
		t.Logf("waiter: %v, %v after the start", err, took)
		if !errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("waiter = %v, want ErrNotAcquired", err)
		}
		if took > wait+per+time.Second {
			t.Fatalf("waiter with a budget of %v returned after %v, more than one attempt's timeout (%v) past it", wait, took, per)
		}
	case <-time.After(wait + 10*time.Second):
		at := start
		select {
		case at = <-paused:
		default:
		}
		t.Fatalf("waiter with a budget of %v still waiting %v after the pause", wait, time.Since(at))
	}
	resume()
	nameFreedOnResume(t, l, newClient(t, c.Endpoints(), nil))
}
