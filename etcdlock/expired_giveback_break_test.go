package etcdlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/etcdserver"
	"github.com/fencekit/fence/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestExpiredDuringQuorumLossGivenBack: a lease that ends at its deadline
// while the cluster has no quorum (its renewals, or with fence.TTL its
// holder's silence, let it run out) revoked its etcd lease with one try of
// half a second, which cannot get through then, and left it "to expire on
// the server". It does not expire: the next leader gives every etcd lease
// its whole TTL again, so once quorum was back the key held the lock for
// nobody for a full TTL more. Its revoke is now retried in the background
// until it gets through, as a failed Acquire's or Release's is.
func TestExpiredDuringQuorumLossGivenBack(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	leader := etcdtest.Leader(t, c)
	var followers []*etcdserver.Member
	for _, m := range c.Members {
		if m != leader {
			followers = append(followers, m)
		}
	}
	// Only the member that stays up: no request of the Locker's waits in
	// a paused member's socket, to be applied once it resumes.
	l := newLocker(t, []string{leader.ClientURL}, nil)
	other := newLocker(t, c.Endpoints(), nil)
	admin := newClient(t, c.Endpoints(), nil)
	name, ttl := t.Name(), 4*time.Second
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	id := leaseID(t, lease)
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
	select {
	case <-lease.Done():
	case <-time.After(ttl + 5*time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("Err = %v; want ErrLeaseLost", lease.Err())
	}
	// The revoke at the end could not get through; the quorum loss lasts
	// past the etcd lease's TTL.
	<-time.After(ttl)
	resume()
	etcdtest.Leader(t, c)
	for _, m := range c.Members {
		if err := m.WaitReady(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	recovered := time.Now()
	got, err := other.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(ttl), fence.Wait(2*time.Second))
	if err != nil {
		ttlResp, _ := admin.TimeToLive(ctxFor(t, 10*time.Second), id)
		keys, _ := admin.Get(ctxFor(t, 10*time.Second), l.Prefix(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
		var left, granted int64
		if ttlResp != nil {
			left, granted = ttlResp.TTL, ttlResp.GrantedTTL
		}
		var n int64
		if keys != nil {
			n = keys.Count
		}
		t.Fatalf("the lock was not acquirable %v after quorum came back: %v (the expired lease's etcd lease %x has %d s left of %d, keys %d)",
			time.Since(recovered), err, int64(id), left, granted, n)
	}
	if got.Token() <= lease.Token() {
		t.Errorf("token %d after %d", got.Token(), lease.Token())
	}
	if err := got.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release of the expired lease = %v; want ErrLeaseLost", err)
	}
	waitGiveBacks(t, 0, 10*time.Second)
}
