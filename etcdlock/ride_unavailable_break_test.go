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
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	methodDelete = "/etcdserverpb.KV/DeleteRange"
	methodGrant  = "/etcdserverpb.Lease/LeaseGrant"
)

// unavailableWhile returns a client of the shared server whose calls of
// method fail, unsent, while down is true; failed counts them. A delete
// fails with "etcdserver: no leader" (Unavailable), as a cluster without
// a leader answers, a Grant with "raft proposal dropped", as a leader
// handing over does: clientv3 itself sends a Grant again on Unavailable,
// within the attempt, so that etcdlock never sees it.
func unavailableWhile(t *testing.T, method string, down *atomic.Bool, failed *atomic.Int64) *clientv3.Client {
	t.Helper()
	fail := rpctypes.ErrGRPCNoLeader
	if method == methodGrant {
		fail = status.Error(codes.Unknown, "raft proposal dropped")
	}
	return dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if m == method && down.Load() {
				failed.Add(1)
				return fail
			}
			return invoker(ctx, m, req, reply, cc, opts...)
		}))
}

// waitFailed waits until failed has counted n calls, failing the test
// after 10 s.
func waitFailed(t *testing.T, failed *atomic.Int64, n int64) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(10 * time.Second); failed.Load() < n; <-tick.C {
		if time.Now().After(end) {
			t.Fatalf("%d calls failed with Unavailable in 10 s, want %d", failed.Load(), n)
		}
	}
}

// With etcd unavailable for good, Release and Extend try again only
// within their ctx and until the lease's deadline, never longer: a
// Release on a ctx of 1 s returns after it with an error matching ctx's,
// one on a ctx without a deadline at the lease's deadline; an Extend on a
// ctx of 1 s returns ctx's error, the lease held and its Deadline
// unmoved, one on a ctx without a deadline an error matching
// fence.ErrLeaseLost at the lease's deadline, when the lease is over.
func TestReleaseExtendUnavailableStaysDown(t *testing.T) {
	for _, tc := range []struct {
		name string
		ttl  time.Duration
		ctx  time.Duration // zero: no deadline
	}{
		{"Release ctx", 10 * time.Second, time.Second},
		{"Release deadline", 2 * time.Second, 0},
		{"Extend ctx", 10 * time.Second, time.Second},
		{"Extend deadline", 2 * time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := strings.HasPrefix(tc.name, "Release")
			method := methodGrant
			if release {
				method = methodDelete
			}
			var down atomic.Bool
			var failed atomic.Int64
			l, err := etcdlock.New(unavailableWhile(t, method, &down, &failed), nil)
			if err != nil {
				t.Fatal(err)
			}
			lease, err := l.Acquire(ctxFor(t, 10*time.Second), freshName(t), fence.TTL(tc.ttl))
			if err != nil {
				t.Fatal(err)
			}
			down.Store(true)
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tc.ctx > 0 {
				ctx, cancel = context.WithTimeout(ctx, tc.ctx)
			}
			defer cancel()
			dl := lease.Deadline()
			start := time.Now()
			if release {
				err = lease.Release(ctx)
			} else {
				err = lease.Extend(ctx, 20*time.Second)
			}
			took := time.Since(start)
			t.Logf("%v after %v, %d calls failed", err, took, failed.Load())
			bound := time.Until(dl) + took
			if tc.ctx > 0 {
				bound = tc.ctx
			}
			if took < bound-50*time.Millisecond || took > bound+time.Second {
				t.Errorf("returned after %v, want %v (ctx's end or the deadline) and at most 1 s more", took, bound)
			}
			if failed.Load() < 3 {
				t.Errorf("%d calls failed with Unavailable: it did not try again", failed.Load())
			}
			// An Extend past the deadline says the lease expired.
			if err == nil || (release || tc.ctx > 0) && !strings.Contains(err.Error(), "no leader") && !strings.Contains(err.Error(), "proposal dropped") {
				t.Fatalf("err = %v, want the Unavailable error", err)
			}
			switch {
			case tc.ctx > 0 && !errors.Is(err, context.DeadlineExceeded):
				t.Errorf("err = %v, want an error matching ctx's", err)
			case !release && tc.ctx == 0 && !errors.Is(err, fence.ErrLeaseLost):
				t.Errorf("Extend = %v past the deadline, want an error matching fence.ErrLeaseLost", err)
			case !release && tc.ctx > 0:
				if errors.Is(err, fence.ErrLeaseLost) || lease.Err() != nil || !lease.Deadline().Equal(dl) {
					t.Errorf("Extend = %v; the lease's Err %v, Deadline moved by %v; want it held as it was", err, lease.Err(), lease.Deadline().Sub(dl))
				}
			case release && lease.Err() != fence.ErrReleased:
				t.Errorf("Err = %v after the Release that failed, want fence.ErrReleased", lease.Err())
			}
			down.Store(false)
			if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
				t.Error(err)
			}
		})
	}
}

// An Extend whose ctx ends while it tries its Grant again returns an
// error matching ctx's (context.DeadlineExceeded), every time: Close's
// cut of the Grant (on the Extend's context of ctx) ran in its own
// goroutine as ctx ended, and could cancel the Grant's context before
// ctx's own end reached it, giving context.Canceled (once in a CI run of
// TestReleaseExtendUnavailableStaysDown).
func TestExtendCtxEndIsCtxError(t *testing.T) {
	var down atomic.Bool
	var failed atomic.Int64
	l, err := etcdlock.New(unavailableWhile(t, methodGrant, &down, &failed), nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), freshName(t), fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	for i := range 300 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+i%5)*time.Millisecond)
		err := lease.Extend(ctx, time.Minute)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Extend %d = %v, want an error matching context.DeadlineExceeded", i, err)
		}
	}
	down.Store(false)
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Error(err)
	}
}

// Close called while an Extend tries its Grant again after Unavailable
// ends that Extend at once, with an error matching fence.ErrClosed (the
// Deadline unmoved), and releases the lease, rather than wait for the
// Extend until Close's own ctx ends while the lease it is about to release
// is kept. A Release under way is waited for within Close's ctx, as ever:
// Close returns at its ctx's end, and that Release goes on, within its own
// ctx, and deletes the key once etcd answers.
func TestCloseDuringUnavailableRetry(t *testing.T) {
	for _, call := range []string{"Extend", "Release"} {
		t.Run(call, func(t *testing.T) {
			method := methodGrant
			if call == "Release" {
				method = methodDelete
			}
			var down atomic.Bool
			var failed atomic.Int64
			l, err := etcdlock.New(unavailableWhile(t, method, &down, &failed), nil)
			if err != nil {
				t.Fatal(err)
			}
			name := freshName(t)
			ctx := ctxFor(t, 30*time.Second)
			lease, err := l.Acquire(ctx, name, fence.TTL(20*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			dl := lease.Deadline()
			down.Store(true)
			res := make(chan error, 1)
			go func() { res <- releaseOrExtend(ctx, lease, call) }()
			waitFailed(t, &failed, 3)
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			start := time.Now()
			cerr := l.Close(cctx)
			took := time.Since(start)
			t.Logf("Close = %v after %v", cerr, took)
			admin := newClient(t, shared.Endpoints(), nil)
			if call == "Extend" {
				select {
				case err := <-res:
					if !errors.Is(err, fence.ErrClosed) || !lease.Deadline().Equal(dl) {
						t.Errorf("Extend = %v, Deadline moved by %v; want an error matching fence.ErrClosed, the Deadline unmoved", err, lease.Deadline().Sub(dl))
					}
				default:
					t.Fatalf("the Extend still tries again after Close returned")
				}
				if cerr != nil {
					t.Errorf("Close = %v, want nil", cerr)
				}
				if lease.Err() != fence.ErrReleased {
					t.Errorf("Err = %v after Close, want fence.ErrReleased", lease.Err())
				}
				if n := countKeys(t, admin, l.Prefix(name)); n != 0 {
					t.Errorf("%d keys left after Close", n)
				}
				return
			}
			if took > 2*time.Second || cerr == nil || !errors.Is(cerr, context.DeadlineExceeded) {
				t.Errorf("Close = %v after %v; want ctx's error after 1 s", cerr, took)
			}
			select {
			case err := <-res:
				t.Fatalf("the Release returned %v with etcd still unavailable and its ctx not ended", err)
			default:
			}
			down.Store(false)
			select {
			case err := <-res:
				if err != nil {
					t.Errorf("Release = %v once etcd answered, want nil", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the Release has not returned 5 s after etcd answered")
			}
			if n := countKeys(t, admin, l.Prefix(name)); n != 0 {
				t.Errorf("%d keys left after the Release", n)
			}
		})
	}
}

// A Release or Extend trying again after Unavailable ends within a tenth
// of a second when the user closes the client, with an error matching
// fence.ErrClosed (or, for Extend, fence.ErrLeaseLost: the client's close
// ends the lease), not after the back-off under way (up to 1 s).
func TestClosedClientEndsUnavailableRetry(t *testing.T) {
	for _, call := range []string{"Extend", "Release"} {
		t.Run(call, func(t *testing.T) {
			method := methodGrant
			if call == "Release" {
				method = methodDelete
			}
			var down atomic.Bool
			var failed atomic.Int64
			c := unavailableWhile(t, method, &down, &failed)
			l, err := etcdlock.New(c, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx := ctxFor(t, 30*time.Second)
			lease, err := l.Acquire(ctx, freshName(t), fence.TTL(20*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			down.Store(true)
			res := make(chan error, 1)
			go func() { res <- releaseOrExtend(ctx, lease, call) }()
			// Eight failures in a row: the back-off is half a second to
			// one by then.
			waitFailed(t, &failed, 8)
			closed := time.Now()
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-res:
				took := time.Since(closed)
				t.Logf("%s = %v, %v after the client's close", call, err, took)
				// The lease's run ends an Extend's lease as lost on the
				// client's close, which Extend may see first.
				if !errors.Is(err, fence.ErrClosed) && (call == "Release" || !errors.Is(err, fence.ErrLeaseLost)) {
					t.Errorf("%s = %v, want an error matching fence.ErrClosed", call, err)
				}
				if took > 100*time.Millisecond {
					t.Errorf("%s returned %v after the client's close", call, took)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s has not returned 5 s after the client's close", call)
			}
		})
	}
}

// releaseOrExtend calls lease's Release, or its Extend to 30 s, as call
// names.
func releaseOrExtend(ctx context.Context, lease fence.Lease, call string) error {
	if call == "Release" {
		return lease.Release(ctx)
	}
	return lease.Extend(ctx, 30*time.Second)
}
