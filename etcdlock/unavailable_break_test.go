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
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// isCreateTxn matches Acquire's create Txn: its Then branch puts the key
// on an etcd lease.
func isCreateTxn(tr *pb.TxnRequest) bool {
	return len(tr.Success) > 0 && tr.Success[0].GetRequestPut().GetLease() != 0
}

// isCheckTxn matches a waiter's check: a Txn that compares its key's
// create revision with the one it was made at and only reads.
func isCheckTxn(tr *pb.TxnRequest) bool {
	return len(tr.Compare) == 1 && tr.Compare[0].Target == pb.Compare_CREATE && tr.Compare[0].GetCreateRevision() != 0 &&
		len(tr.Success) == 1 && tr.Success[0].GetRequestRange() != nil
}

// unavailableOnce returns a client of endpoints whose first Txn that match
// accepts fails with the error a member's restart gave in CI ("error
// reading from server: EOF", code Unavailable), which clientv3 does not
// retry for a Txn. If applied, the Txn is sent first and only its reply
// lost, as when the member is killed between applying it and answering.
// failed counts the Txns failed so.
func unavailableOnce(t *testing.T, match func(*pb.TxnRequest) bool, applied bool, failed *atomic.Int64) *clientv3.Client {
	t.Helper()
	return dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			tr, ok := req.(*pb.TxnRequest)
			if !ok || !match(tr) || !failed.CompareAndSwap(0, 1) {
				return invoker(ctx, method, req, reply, cc, opts...)
			}
			if applied {
				if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
					return err
				}
			}
			return status.Error(codes.Unavailable, "error reading from server: EOF")
		}))
}

// A waiter with a Wait budget keeps its place when a call of its Acquire
// fails with Unavailable, as etcd's calls do while a member restarts: it
// tries again within its budget, then takes the lock once the holder
// releases it. In CI a member's restart failed the create Txn of a waiter
// with 40 s of budget at once (TestStandaloneRestartLosesNothing: "create
// fence/restarted/…: rpc error: code = Unavailable desc = error reading
// from server: EOF"); before the fix, each case here failed so at once: the
// create Txn, applied or not ("create …: rpc error: code = Unavailable"),
// and the check a waiter makes when the key before its own goes ("wait:
// rpc error: code = Unavailable"). A create Txn applied with its reply lost
// made the key: the retry finds it and takes it as its own.
func TestWaiterRetriesUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		match   func(*pb.TxnRequest) bool
		applied bool
	}{
		{"create applied", isCreateTxn, true},
		{"create not applied", isCreateTxn, false},
		{"check", isCheckTxn, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxFor(t, 30*time.Second)
			name := freshName(t)
			holder, err := newLocker(t, shared.Endpoints(), nil).Acquire(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			var failed atomic.Int64
			l, err := etcdlock.New(unavailableOnce(t, tc.match, tc.applied, &failed), nil)
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				lease fence.Lease
				err   error
			}
			got := make(chan result, 1)
			go func() {
				lease, err := l.Acquire(ctx, name, fence.Wait(20*time.Second))
				got <- result{lease, err}
			}()
			// The waiter's key made (the create Txn applied, whatever
			// became of its reply), the holder releases: the check
			// that follows sees the lock free.
			admin := newClient(t, shared.Endpoints(), nil)
			for end := time.Now().Add(10 * time.Second); countKeys(t, admin, l.Prefix(name)) < 2; {
				select {
				case r := <-got:
					t.Fatalf("the waiter returned while the lock was held: %v, %v", r.lease, r.err)
				default:
				}
				if time.Now().After(end) {
					t.Fatal("no waiter in line after 10 s")
				}
			}
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-got:
				if r.err != nil {
					t.Fatalf("waiter: %v (Txns failed with Unavailable: %d)", r.err, failed.Load())
				}
				if r.lease.Token() <= holder.Token() {
					t.Errorf("waiter's token %d, not above the holder's %d", r.lease.Token(), holder.Token())
				}
				if err := r.lease.Release(ctx); err != nil {
					t.Error(err)
				}
				// A create Txn tried again may have its first attempt
				// applied late, after the key is deleted: its etcd lease
				// is revoked, never kept for the next Acquire.
				if ids := l.SpareIDs(); tc.name != "check" && len(ids) > 0 {
					t.Errorf("the etcd lease of a create Txn tried again was kept: %x", ids)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("the waiter has not taken the lock 15 s after the release")
			}
			if n := failed.Load(); n != 1 {
				t.Fatalf("%d Txns failed with Unavailable; want 1 (the case tested nothing)", n)
			}
			if n := countKeys(t, admin, l.Prefix(name)); n != 0 {
				t.Errorf("%d keys left after the release", n)
			}
		})
	}
}

// The tries again after Unavailable keep the waiter's place for its wait
// budget and no longer, and end with the caller's ctx: with every create
// Txn failing so (a member that does not come back), Acquire returns at
// the end of a 1 s budget with the last Unavailable error, not ErrHeld, and
// at the end of a 1 s ctx (budget a minute) with an error that matches
// ctx's. Without the tries again both returned at once with the first
// error ("took 20.893758ms, want at least 1s", "took 9.069311ms"); with
// them but ctx's end reported as the last Unavailable error, the second
// did not match ctx's error.
func TestWaiterUnavailableBounds(t *testing.T) {
	for _, tc := range []struct {
		name         string
		wait, before time.Duration // the budget, ctx's deadline
	}{
		{"budget", time.Second, 30 * time.Second},
		{"ctx", time.Minute, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(
				func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
					if tr, ok := req.(*pb.TxnRequest); ok && isCreateTxn(tr) {
						return status.Error(codes.Unavailable, "error reading from server: EOF")
					}
					return invoker(ctx, method, req, reply, cc, opts...)
				}))
			l, err := etcdlock.New(c, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.before)
			defer cancel()
			start := time.Now()
			lease, err := l.Acquire(ctx, freshName(t), fence.Wait(tc.wait))
			took := time.Since(start)
			t.Logf("Acquire: %v after %v", err, took)
			bound := min(tc.wait, tc.before)
			if took < bound || took > bound+3*time.Second {
				t.Errorf("took %v, want at least %v and at most 3 s more (a back-off, and a loaded machine)", took, bound)
			}
			if lease != nil || !errors.Is(err, fence.ErrNotAcquired) || errors.Is(err, fence.ErrHeld) || !strings.Contains(err.Error(), "code = Unavailable") {
				t.Errorf("Acquire = %v, %v; want ErrNotAcquired with the Unavailable error, not ErrHeld", lease, err)
			}
			if tc.name == "ctx" && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Acquire = %v; want an error matching ctx's", err)
			}
		})
	}
}
