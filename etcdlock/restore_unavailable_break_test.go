package etcdlock_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdserver"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRestoredKeyAfterUnavailableCreate is TestRestoreWithBumpKeptEtcdLease
// with the first create Txn after the restore failing with Unavailable
// without being applied, as a call does on a connection that a member's
// restart broke (the restore restarts it). The Acquire, with a wait
// budget, sends the Txn again, and that retry finds the restored key on
// the kept etcd lease: it must not take it for the one its own first
// attempt made (that attempt made nothing), whose create revision is from
// before the snapshot. Before, it did: "after the restore the next token
// is 2 (the held lock's was 2); want it above 12 issued since the snapshot
// and above the bumped revision 1000000002": the check that a found key
// is a restored one looked only at whether the Txn had been sent once.
func TestRestoredKeyAfterUnavailableCreate(t *testing.T) {
	c, err := etcdserver.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var armed, failed atomic.Bool
	l, err := etcdlock.New(dialClient(t, c.Endpoints(), grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if tr, ok := req.(*pb.TxnRequest); ok && isCreateTxn(tr) && armed.CompareAndSwap(true, false) {
				failed.Store(true)
				return status.Error(codes.Unavailable, "error reading from server: EOF")
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		})), nil)
	if err != nil {
		t.Fatal(err)
	}
	acquireAfterRestore(t, c, l, func() { armed.Store(true) })
	if !failed.Load() {
		t.Fatal("no create Txn failed with Unavailable: the case tests nothing")
	}
}
