package etcdlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
	"google.golang.org/grpc"
)

// TestCloseDuringCreateTxn: an Acquire whose create Txn is under way when
// its Locker is closed (applied on etcd, its reply not read yet) is work
// that Close must wait for, as it does for a waiter in line: a caller
// closes the client once Close has returned, as New's documentation asks,
// and a give-back sent after that cannot get through. So Close returns
// only once the Acquire has, which fails with ErrNotAcquired and ErrClosed
// and leaves no key, whether the lock was free (its take, read after
// Close came, is given back) or held (it would have waited in line).
//
// It failed (the reply held 1 s): Close returned nil at once, 1 s before
// the Acquire. With the lock held, the Acquire then failed with
// ErrClosed, its give-back tried once since Close had drained, on the
// closed client, and its key was left for its etcd lease's TTL (2 keys
// after the Acquire returned, the holder's and its own); with the lock
// free, it returned a lease (token 5) on a Locker closed 1 s before, its
// key left too once the client was closed.
func TestCloseDuringCreateTxn(t *testing.T) {
	const hold = time.Second
	for _, held := range []bool{true, false} {
		t.Run(map[bool]string{true: "held", false: "free"}[held], func(t *testing.T) {
			var armed atomic.Bool
			applied := make(chan struct{}, 1)
			client := dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(
				func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
					err := invoker(ctx, method, req, reply, cc, opts...)
					if method == "/etcdserverpb.KV/Txn" && err == nil && armed.CompareAndSwap(true, false) {
						// The create Txn is applied; its reply comes
						// hold later, as from a slow network.
						applied <- struct{}{}
						t := time.NewTimer(hold)
						<-t.C
					}
					return err
				}))
			l, err := etcdlock.New(client, nil)
			if err != nil {
				t.Fatal(err)
			}
			admin := newClient(t, shared.Endpoints(), nil)
			pfx := l.Prefix(t.Name())
			keys := int64(0)
			if held {
				holder, err := newLocker(t, shared.Endpoints(), nil).Acquire(ctxFor(t, 10*time.Second), t.Name())
				if err != nil {
					t.Fatal(err)
				}
				defer holder.Release(ctxFor(t, 10*time.Second)) //nolint:errcheck // the verdict is on the keys
				keys = 1
			}
			type result struct {
				lease fence.Lease
				err   error
				at    time.Time
			}
			done := make(chan result, 1)
			armed.Store(true)
			go func() {
				lease, err := l.Acquire(ctxFor(t, 30*time.Second), t.Name(), fence.Wait(10*time.Second))
				done <- result{lease, err, time.Now()}
			}()
			select {
			case <-applied:
			case <-time.After(10 * time.Second):
				t.Fatal("no create Txn after 10 s")
			}
			err = l.Close(ctxFor(t, 5*time.Second))
			closed := time.Now()
			// As a program does once Close has returned.
			_ = client.Close()
			r := <-done
			t.Logf("Close = %v; Acquire = %v, %v after Close returned", err, r.err, r.at.Sub(closed).Round(time.Millisecond))
			if err != nil {
				t.Errorf("Close = %v", err)
			}
			// Within 100 ms: the Acquire's goroutine reads the clock after
			// Acquire returns, and Close's after it is woken by the
			// Acquire's end, so either may read it first (1 ms later in
			// a CI run on a loaded machine); the fault this is for left
			// Close 1 s ahead.
			if d := r.at.Sub(closed); d > 100*time.Millisecond {
				t.Errorf("Acquire under way returned %v after Close had", d.Round(time.Millisecond))
			}
			if r.lease != nil {
				_ = r.lease.Release(ctxFor(t, time.Second))
				t.Errorf("Acquire under way at Close returned a lease (token %d)", r.lease.Token())
			} else if !errors.Is(r.err, fence.ErrNotAcquired) || !errors.Is(r.err, fence.ErrClosed) {
				t.Errorf("Acquire = %v, want ErrNotAcquired and ErrClosed", r.err)
			}
			if n := countKeys(t, admin, pfx); n != keys {
				t.Errorf("%d key(s) after the Acquire returned, want %d (the holder's)", n, keys)
			}
		})
	}
}

// TestCloseEndsAcquireOnHungCluster: an Acquire under way on a cluster
// that answers nothing (its only member hung), with a ctx that never ends,
// fails at once with ErrNotAcquired and ErrClosed when its Locker is
// closed, as fence.ErrClosed says ("at once, whatever its wait budget"),
// and Close returns nil: the Acquire must not hold Close until its ctx
// ends, nor go on after it.
//
// It failed both ways. Before Close counted the Acquires under way, Close
// returned nil at once while the Acquire went on sending its Grant for as
// long as the member hung. Counted but not cancelled, Close waited out its
// 2 s ctx ("1 Acquire(s) still under way or giving back their key") and
// the Acquire still went on.
func TestCloseEndsAcquireOnHungCluster(t *testing.T) {
	const closeTimeout, slack = 2 * time.Second, 500 * time.Millisecond
	c := etcdtest.StartCluster(t, 1)
	hung := c.Members[0]
	granting := make(chan struct{}, 1)
	client := dialClient(t, c.Endpoints(), grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if method == "/etcdserverpb.Lease/LeaseGrant" {
				select {
				case granting <- struct{}{}:
				default:
				}
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}))
	l, err := etcdlock.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	hung.Stop()
	t.Cleanup(hung.Cont)
	type result struct {
		lease fence.Lease
		err   error
		at    time.Time
	}
	done := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(context.Background(), t.Name())
		done <- result{lease, err, time.Now()}
	}()
	select {
	case <-granting:
	case <-time.After(10 * time.Second):
		t.Fatal("no Grant sent after 10 s")
	}
	start := time.Now()
	err = l.Close(ctxFor(t, closeTimeout))
	closed := time.Now()
	t.Logf("Close = %v after %v", err, closed.Sub(start).Round(time.Millisecond))
	if err != nil {
		t.Errorf("Close = %v", err)
	}
	select {
	case r := <-done:
		t.Logf("Acquire = %v, %v after Close was called", r.err, r.at.Sub(start).Round(time.Millisecond))
		if r.lease != nil {
			t.Errorf("Acquire returned a lease (token %d)", r.lease.Token())
		} else if !errors.Is(r.err, fence.ErrNotAcquired) || !errors.Is(r.err, fence.ErrClosed) {
			t.Errorf("Acquire = %v, want ErrNotAcquired and ErrClosed", r.err)
		}
		if r.at.Sub(start) > slack {
			t.Errorf("Acquire returned %v after Close was called", r.at.Sub(start).Round(time.Millisecond))
		}
	case <-time.After(closeTimeout + slack):
		hung.Cont()
		r := <-done
		if r.lease != nil {
			_ = r.lease.Release(ctxFor(t, 10*time.Second))
		}
		t.Fatalf("Acquire still under way %v after Close returned; once the member answered: %v, %v", time.Since(closed).Round(time.Millisecond), r.lease, r.err)
	}
}
