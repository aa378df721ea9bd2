package etcdlock_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdserver"
	"github.com/fencekit/fence/internal/etcdtest"
	"google.golang.org/grpc"
)

// TestWaiterKeepsPlaceDuringLeaderTransfer: a leader that is handing its
// leadership over (etcdctl move-leader; a member stopped gracefully, as in
// a rolling restart, does it too) drops every proposal made on it until
// the transfer ends, unapplied, and answers "rpc error: code = Unknown
// desc = raft proposal dropped", not Unavailable. A waiter with a Wait
// budget on that member must try again within its budget, as it does when
// etcd has no leader, and take the lock once the holder releases. The
// transferee is paused, so that the transfer lasts until raft gives it up
// (an election timeout). Before, the waiter gave up at once with 30 s of
// budget left: "etcdlock: grant: rpc error: code = Unknown desc = raft
// proposal dropped".
func TestWaiterKeepsPlaceDuringLeaderTransfer(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	ctx := ctxFor(t, time.Minute)
	name := t.Name()
	holder, err := newLocker(t, c.Endpoints(), nil).Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	lead := etcdtest.Leader(t, c)
	resume := holdTransfer(t, ctx, c, lead)
	defer resume()
	failed := make(chan error, 1)
	l, err := etcdlock.New(dialClient(t, []string{lead.ClientURL}, grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err != nil {
				select {
				case failed <- err:
				default:
				}
			}
			return err
		})), nil)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease fence.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctx, name, fence.Wait(30*time.Second))
		got <- result{lease, err}
	}()
	select {
	case err := <-failed:
		t.Logf("a call of the waiter during the transfer: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no call of the waiter failed 10 s after Acquire during the transfer")
	}
	resume()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	all := newClient(t, c.Endpoints(), nil)
	for end := time.Now().Add(20 * time.Second); countKeys(t, all, l.Prefix(name)) < 2; {
		select {
		case r := <-got:
			t.Fatalf("the waiter returned while the lock was held, with budget left: %v, %v", r.lease, r.err)
		case <-tick.C:
		}
		if time.Now().After(end) {
			t.Fatal("no waiter in line 20 s after the transfer")
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		if r.lease.Token() <= holder.Token() {
			t.Errorf("waiter's token %d, not above the holder's %d", r.lease.Token(), holder.Token())
		}
		if err := r.lease.Release(ctx); err != nil {
			t.Error(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter has not taken the lock 15 s after the release")
	}
}

// holdTransfer has lead, the cluster's leader, hand its leadership over to
// a follower that it pauses first, and returns once lead drops a write
// ("raft proposal dropped"), as it drops every proposal made on it until
// the transfer ends: when raft gives it up, an election timeout (1 s)
// after it began, or once resume lets the follower take over. resume
// (which may be called again) logs how move-leader ended.
func holdTransfer(t *testing.T, ctx context.Context, c *etcdserver.Cluster, lead *etcdserver.Member) (resume func()) {
	t.Helper()
	var to *etcdserver.Member // a follower
	for _, m := range c.Members {
		if m != lead {
			to = m
			break
		}
	}
	onLead := newClient(t, []string{lead.ClientURL}, nil)
	st, err := onLead.Status(ctx, to.ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	to.Stop()
	// move-leader waits until the transferee leads, or its ctx ends: a
	// transfer that raft gave up waits for ever.
	mctx, cancel := context.WithCancel(ctx)
	moved := make(chan error, 1)
	go func() {
		_, err := onLead.MoveLeader(mctx, st.Header.MemberId)
		moved <- err
	}()
	var once sync.Once
	resume = func() {
		once.Do(func() {
			to.Cont()
			select {
			case err := <-moved:
				t.Logf("move-leader: %v", err)
			case <-time.After(2 * time.Second):
				t.Logf("move-leader: the transferee does not lead 2 s after it was resumed (raft gave the transfer up)")
			}
			cancel()
		})
	}
	// The transfer has begun once the leader drops a write.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(10 * time.Second); ; {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := onLead.Put(pctx, t.Name()+"-probe", "")
		cancel()
		if err != nil && strings.Contains(err.Error(), "raft proposal dropped") {
			return resume
		}
		if time.Now().After(end) {
			resume()
			t.Fatalf("the leader still takes writes 10 s after move-leader (last: %v)", err)
		}
		<-tick.C
	}
}
