package etcdlock_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// dropped counts the calls of a client that failed with the error a
// leader handing its leadership over gives.
func dropped(n *atomic.Int64) grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err != nil && strings.Contains(err.Error(), "raft proposal dropped") {
				n.Add(1)
			}
			return err
		})
}

// A Release and an Extend made while the leader hands its leadership over
// (holdTransfer: etcdctl move-leader, or a member stopped gracefully in a
// rolling restart) ride it out, as an Acquire with a budget does: the
// leader drops every proposal for up to an election timeout (1 s), far
// less than the lease's 10 s left, and the call is sent again after a
// back-off. Before, each failed at once, within 10 ms: "etcdlock: release
// \"...\": rpc error: code = Unknown desc = raft proposal dropped" (the
// lease ended as released all the same, its key left until the revoke
// retried in the background got through), and "etcdlock: extend
// \"...\": grant: rpc error: code = Unknown desc = raft proposal dropped",
// the Deadline unmoved with the lease held.
func TestReleaseExtendRideOutLeaderTransfer(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	all := newClient(t, c.Endpoints(), nil)
	for _, call := range []string{"Release", "Extend"} {
		t.Run(call, func(t *testing.T) {
			ctx := ctxFor(t, time.Minute)
			lead := etcdtest.Leader(t, c)
			var failed atomic.Int64
			l, err := etcdlock.New(dialClient(t, []string{lead.ClientURL}, dropped(&failed)), nil)
			if err != nil {
				t.Fatal(err)
			}
			lease, err := l.Acquire(ctx, t.Name(), fence.TTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			resume := holdTransfer(t, ctx, c, lead)
			defer resume()
			start := time.Now()
			if call == "Release" {
				err = lease.Release(ctx)
			} else {
				err = lease.Extend(ctx, 20*time.Second)
			}
			took := time.Since(start)
			t.Logf("%s during the transfer: %v after %v (%d calls dropped)", call, err, took, failed.Load())
			if failed.Load() == 0 {
				t.Fatal("no call was dropped: the transfer had ended (the case tested nothing)")
			}
			if err != nil {
				t.Fatalf("%s = %v, want nil: the transfer ended within a second", call, err)
			}
			if call == "Release" {
				if n := countKeys(t, all, l.Prefix(t.Name())); n != 0 {
					t.Errorf("%d keys left after Release returned nil", n)
				}
				return
			}
			if left := time.Until(lease.Deadline()); left < 20*time.Second-took-time.Second {
				t.Errorf("Deadline %v from now after Extend(20 s), which took %v", left, took)
			}
			if err := lease.Err(); err != nil {
				t.Errorf("Err = %v after the Extend", err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
}

// isMoveTxn matches Extend's move: a Txn that compares the key's create
// and mod revisions and puts it on an etcd lease.
func isMoveTxn(tr *pb.TxnRequest) bool {
	return len(tr.Compare) == 2 && tr.Compare[1].Target == pb.Compare_MOD && isCreateTxn(tr)
}

// An Extend whose move Txn fails with Unavailable (the connection lost
// under it, as a member restarts), applied with its reply lost or not
// sent, sends it again: applied, the retry finds the key on the new etcd
// lease (the Else branch) and takes it as moved. Before, a move not sent
// failed the Extend, the 10 s lease's Deadline unmoved: "etcdlock: extend
// \"...\": rpc error: code = Unavailable desc = error reading from
// server: EOF" (its settle put the key back on its etcd lease); one
// applied passed already (the settle found the key on the new etcd lease
// and took the Extend as made).
func TestExtendMoveUnavailable(t *testing.T) {
	for _, applied := range []bool{true, false} {
		t.Run(map[bool]string{true: "applied", false: "not applied"}[applied], func(t *testing.T) {
			ctx := ctxFor(t, 30*time.Second)
			var failed atomic.Int64
			l, err := etcdlock.New(unavailableOnce(t, isMoveTxn, applied, &failed), nil)
			if err != nil {
				t.Fatal(err)
			}
			lease, err := l.Acquire(ctx, freshName(t), fence.TTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = lease.Release(ctx) }()
			before := lease.Deadline()
			if err := lease.Extend(ctx, 20*time.Second); err != nil {
				t.Fatalf("Extend = %v (move Txns failed with Unavailable: %d)", err, failed.Load())
			}
			if failed.Load() != 1 {
				t.Fatalf("%d move Txns failed with Unavailable; want 1 (the case tested nothing)", failed.Load())
			}
			if !lease.Deadline().After(before.Add(5 * time.Second)) {
				t.Errorf("Deadline moved from %v to %v by Extend(20 s)", before, lease.Deadline())
			}
			admin := newClient(t, shared.Endpoints(), nil)
			resp, err := admin.Get(ctx, lease.(*etcdlock.Lease).Key())
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != int64(lease.Token()) {
				t.Fatalf("the key after Extend: %v", resp.Kvs)
			}
			ttl, err := admin.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
			if err != nil {
				t.Fatal(err)
			}
			if ttl.TTL < 15 {
				t.Errorf("the key's etcd lease has %d s left after Extend(20 s)", ttl.TTL)
			}
		})
	}
}

// isDelete matches Release's delete.
func isDelete(method string) bool { return method == "/etcdserverpb.KV/DeleteRange" }

// A Release whose delete fails with Unavailable sends it again: not sent,
// the retry deletes the key and Release returns nil; applied with its
// reply lost, the retry finds the key gone, which it cannot tell from
// another's delete, and returns nil as for a release (fence.Lease's
// Release; it said fence.ErrLeaseLost until the backends agreed on it),
// as after an attempt that timed out. Sending it again is safe: it deletes
// only the key named after this lease's etcd lease, which no other
// Acquire can use while the Release runs (it is kept for reuse only after
// a delete that went through at its first attempt): the lock taken by
// another holder between the lost reply and the retry stays held. Before,
// Release failed in both cases with "etcdlock: release \"...\": rpc
// error: code = Unavailable desc = error reading from server: EOF".
func TestReleaseDeleteUnavailable(t *testing.T) {
	for _, applied := range []bool{true, false} {
		t.Run(map[bool]string{true: "applied", false: "not applied"}[applied], func(t *testing.T) {
			ctx := ctxFor(t, 30*time.Second)
			name := freshName(t)
			other := newLocker(t, shared.Endpoints(), nil)
			var failed atomic.Int64
			var next fence.Lease // taken between the lost reply and the retry
			c := dialClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(
				func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
					if !isDelete(method) || !failed.CompareAndSwap(0, 1) {
						return invoker(ctx, method, req, reply, cc, opts...)
					}
					if applied {
						if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
							return err
						}
						var err error
						if next, err = other.Acquire(ctx, name); err != nil {
							t.Errorf("the lock after the delete applied: %v", err)
						}
					}
					return status.Error(codes.Unavailable, "error reading from server: EOF")
				}))
			l, err := etcdlock.New(c, nil)
			if err != nil {
				t.Fatal(err)
			}
			lease, err := l.Acquire(ctx, name, fence.TTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			err = lease.Release(ctx)
			t.Logf("Release = %v", err)
			if failed.Load() != 1 {
				t.Fatalf("%d deletes failed with Unavailable; want 1 (the case tested nothing)", failed.Load())
			}
			admin := newClient(t, shared.Endpoints(), nil)
			if !applied {
				if err != nil {
					t.Fatalf("Release = %v, want nil", err)
				}
				if n := countKeys(t, admin, l.Prefix(name)); n != 0 {
					t.Errorf("%d keys left", n)
				}
				return
			}
			if err != nil {
				t.Errorf("Release = %v; want nil: its own attempt may have deleted the key", err)
			}
			if next == nil {
				t.FailNow()
			}
			defer func() { _ = next.Release(ctx) }()
			if err := next.Err(); err != nil {
				t.Fatalf("the next holder's lease: %v", err)
			}
			resp, err := admin.Get(ctx, next.(*etcdlock.Lease).Key())
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != int64(next.Token()) {
				t.Errorf("the next holder's key after the retried delete: %v", resp.Kvs)
			}
		})
	}
}

// A watchdog renewal sent as the only member is killed (restarted from
// its data dir about a second later, a fifth of the 6 s lease time) does
// not end the lease: the renewal that failed is tried again every 100 ms
// until the deadline (clientv3's KeepAliveOnce itself sends it again on
// Unavailable, within the attempt's timeout), and one after the restart
// renews it. This held before the change that has Release and Extend
// ride out Unavailable: the watchdog never gave up on a failed renewal
// before its deadline.
func TestWatchdogRidesOutRestart(t *testing.T) {
	const ttl = 6 * time.Second
	c := etcdtest.Start(t)
	m := c.Members[0]
	var armed atomic.Bool
	due := make(chan struct{})
	killed := make(chan struct{})
	cl := dialClient(t, c.Endpoints(), grpc.WithChainStreamInterceptor(
		func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			if method == "/etcdserverpb.Lease/LeaseKeepAlive" && armed.CompareAndSwap(true, false) {
				close(due)
				<-killed
			}
			return streamer(ctx, desc, cc, method, opts...)
		}))
	l, err := etcdlock.New(cl, &etcdlock.Options{WatchdogTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 30*time.Second)
	lease, err := l.Acquire(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	select {
	case <-due:
	case <-time.After(ttl):
		t.Fatal("no renewal within the lease time")
	}
	had := lease.Deadline()
	m.Kill()
	close(killed)
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitReady(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("member back %v before the deadline the lease had at the renewal", time.Until(had).Round(time.Millisecond))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !lease.Deadline().After(had) {
		select {
		case <-lease.Done():
			t.Fatalf("the lease ended: %v", lease.Err())
		case <-tick.C:
		}
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("Err = %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
