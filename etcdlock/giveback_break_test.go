package etcdlock_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdserver"
	"github.com/fencekit/fence/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// giveBacks counts the goroutines running giveBack's background retry.
func giveBacks() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		for _, line := range bytes.Split(g, []byte("\n")) {
			if bytes.HasPrefix(line, []byte("github.com/fencekit/fence/etcdlock.(*Locker).giveBackCounted.func")) {
				count++
				break
			}
		}
	}
	return count
}

// waitGiveBacks waits until at most n background retries run, failing the
// test after limit.
func waitGiveBacks(t *testing.T, n int, limit time.Duration) {
	t.Helper()
	for end := time.Now().Add(limit); giveBacks() > n; {
		if time.Now().After(end) {
			t.Fatalf("%d background revokes still running after %v, want at most %d", giveBacks(), limit, n)
		}
		pollPause()
	}
}

// pollPause paces a poll of the goroutines (runtime.Stack stops the world).
func pollPause() { <-time.After(20 * time.Millisecond) }

// TestGiveBackGivesUpWhileLeaseOutlivesQuorumLoss: giveBack stopped
// retrying once the etcd lease's TTL had passed, "by then it has expired
// anyway". It has not if the cluster had no leader meanwhile: etcd expires
// leases on the leader only, a leader that loses quorum stops expiring
// them (Demote), and the next leader gives every lease its full TTL again
// (Promote, lease checkpointing being off by default). A Release during a
// quorum loss that lasts longer than the TTL fails; its revoke was
// retried, then abandoned; once quorum was back the holder's key was still
// there, on an etcd lease nobody renews, and the lock held by nobody for a
// full TTL more (plus an election timeout). The retry now goes on until it
// gets through. The create Txn of a failed Acquire, left in the old
// leader's log, is in the same case.
func TestGiveBackGivesUpWhileLeaseOutlivesQuorumLoss(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	leader := etcdtest.Leader(t, c)
	var followers []*etcdserver.Member
	for _, m := range c.Members {
		if m != leader {
			followers = append(followers, m)
		}
	}
	// The Locker talks to the member that stays up only: none of its
	// requests waits in a paused member's socket, to be applied (a revoke
	// among them) once it resumes.
	l := newLocker(t, []string{leader.ClientURL}, nil)
	other := newLocker(t, c.Endpoints(), nil)
	admin := newClient(t, c.Endpoints(), nil)
	name, ttl := t.Name(), 4*time.Second
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	id := leaseID(t, lease)

	// Quorum lost: the leader steps down (CheckQuorum) and nobody leads.
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			for _, m := range followers {
				m.Cont()
			}
		}
	}
	defer resume()
	for _, m := range followers {
		m.Stop()
	}
	for end := time.Now().Add(10 * time.Second); leader.IsLeader(ctxFor(t, time.Second)); {
		if time.Now().After(end) {
			t.Fatal("the leader did not step down 10 s after losing quorum")
		}
	}

	rctx, cancel := context.WithTimeout(context.Background(), time.Second)
	err = lease.Release(rctx)
	cancel()
	if err == nil {
		t.Fatal("Release succeeded without quorum")
	}
	t.Logf("release: %v", err)
	if giveBacks() == 0 {
		t.Fatal("no background revoke after the failed Release")
	}
	// giveBack gives up after the etcd lease's TTL. (A retry that went on
	// while nobody leads is no failure: resume after the TTL and a margin
	// then.)
	for end := time.Now().Add(ttl + 3*time.Second); giveBacks() > 0 && time.Now().Before(end); {
		pollPause()
	}
	t.Logf("background revokes running after the TTL: %d", giveBacks())

	resume()
	etcdtest.Leader(t, c)
	for _, m := range c.Members {
		if err := m.WaitReady(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	recovered := time.Now()
	ttlResp, err := admin.TimeToLive(ctxFor(t, 10*time.Second), id)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := admin.Get(ctxFor(t, 10*time.Second), l.Prefix(name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	// A retry that went on would revoke it within a second or so of the
	// cluster answering again.
	got, err := other.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(ttl), fence.Wait(2*time.Second))
	if err != nil {
		t.Fatalf("the lock was not acquirable %v after quorum came back: %v (the released lease's etcd lease %x has %d s left of %d, keys %d: the background revoke gave up while it lived)",
			time.Since(recovered), err, int64(id), ttlResp.TTL, ttlResp.GrantedTTL, keys.Count)
	}
	if err := got.Release(ctxFor(t, 10*time.Second)); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatal(err)
	}
	waitGiveBacks(t, 0, 10*time.Second)
}

// TestRepeatedFailedReleaseStartsOneGiveBack: a user who retries a Release
// that failed (a loop with a short ctx, while the only member hangs) gets
// a background revoke goroutine per failed call, all revoking the same
// etcd lease, each for up to the etcd lease's TTL: with a one-hour TTL and
// a retry every half second, some 7200 goroutines per lease, each sending a
// revoke every second and a half. One per etcd lease is enough.
func TestRepeatedFailedReleaseStartsOneGiveBack(t *testing.T) {
	c := etcdtest.Start(t)
	m := c.Members[0]
	l := newLocker(t, c.Endpoints(), nil)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			m.Cont()
		}
	}()
	m.Stop()
	const tries = 6
	for range tries {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err := lease.Release(ctx)
		cancel()
		if err == nil {
			t.Fatal("Release succeeded on a paused member")
		}
	}
	n := giveBacks()
	m.Cont()
	resumed = true
	if err := m.WaitReady(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	waitGiveBacks(t, 0, 10*time.Second)
	if n > 1 {
		t.Errorf("%d background revokes of one etcd lease after %d failed Releases, want 1", n, tries)
	}
}

// TestReleaseRetriedBeforeGiveBackConfirmedSaysLost: a Release that fails
// before sending anything (its ctx done) and whose revoke fails too (a
// member that hangs; here a client interceptor fails the revokes, so that
// none is left in a member's socket to be applied late) has the revoke
// retried in the background. The user calls Release again while the
// background revoke has been applied but its reply not yet read: the
// second Release finds the key gone, and cannot tell that revoke from a
// loss (the etcd lease expired while the cluster hung, another owner took
// the lock: TestRetriedReleaseAfterExpiryDuringGiveBackIsLost). It says
// lost, as the package documents for a Release that cannot vouch, rather
// than vouch for a lease that may have been lost (a mark set as the revoke
// was sent, for a while, said nil here).
func TestReleaseRetriedBeforeGiveBackConfirmedSaysLost(t *testing.T) {
	c := etcdtest.Start(t)
	var failing, holding atomic.Bool
	landed, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	cl, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if method != "/etcdserverpb.Lease/LeaseRevoke" {
					return invoker(ctx, method, req, reply, cc, opts...)
				}
				if failing.Load() {
					return context.DeadlineExceeded // as a revoke to a member that hangs
				}
				err := invoker(ctx, method, req, reply, cc, opts...)
				if err == nil && holding.Load() {
					once.Do(func() { close(landed); <-proceed })
				}
				return err
			})},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	l, err := etcdlock.New(cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	failing.Store(true)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := lease.Release(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release with a cancelled ctx: %v", err)
	}
	if giveBacks() == 0 {
		t.Fatal("no background revoke after the failed Release")
	}
	holding.Store(true)
	failing.Store(false)
	select {
	case <-landed:
	case <-time.After(10 * time.Second):
		t.Fatal("the background revoke did not get through within 10 s")
	}
	err = lease.Release(ctxFor(t, 10*time.Second))
	close(proceed)
	waitGiveBacks(t, 0, 10*time.Second)
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release again, the Locker's own revoke applied but not yet confirmed: %v, want ErrLeaseLost", err)
	}
}
