package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// A lease whose acquisition go-redis sent twice (the first copy delayed
// on its way) that ends at its deadline, without Release: nothing gives
// the lock back with the revocation mark, so the first copy, run after the
// lease ended, takes the lock again on its node for its lease time, for
// nobody. With the copies delayed on two nodes of three, nobody can take
// the name for a whole lease time after the lease ended. Close, which
// waits for the Locker's background work, is called before the copies
// arrive: nothing of the lease is pending any more.
func TestDelayedAcquisitionCopyAfterExpiry(t *testing.T) {
	srvs := nodes(t, 3)
	l, ds := delayedLocker(t, srvs)
	const name, ttl = "delayed-copy-expiry", 2 * time.Second
	warmUp(t, l, srvs, name, ttl)

	ds[0].armed.Store(true)
	ds[1].armed.Store(true)
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	select {
	case <-lease.Done():
	case <-ctxFor(t).Done():
		t.Fatal("the lease did not end at its deadline")
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
	if err := l.Close(ctxFor(t)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ds[0].Let(t)
	ds[1].Let(t)
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		other := newLocker(t, srvs, &redlock.Options{NodeTimeout: generous})
		_, err := other.Acquire(ctxFor(t), name, fence.TTL(ttl))
		t.Errorf("after the lease expired (%v), the delayed copies of its acquisition locked nodes %v; another Locker's Acquire: %v", lease.Err(), on, err)
	}
}

// A ClusterClient resends a command whose read timed out on its own
// (ClusterClient.process retries it up to MaxRedirects times, 3 by
// default) though its MaxRetries is -1 by default: resend.After calls it a
// client that never resends, so a lease acquired through a resent
// request is released without the revocation mark, and the delayed first
// copy takes the lock again on that node for its lease time after
// Release.
func TestDelayedAcquisitionCopyClusterClient(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	srvs := nodes(t, 2)
	acq, _ := redlock.ScriptHashes()
	d := &firstDelayer{match: []byte(acq)}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), ReadTimeout: 100 * time.Millisecond, Dialer: d.Dial})
	t.Cleanup(func() { _ = cc.Close() })
	cs := []redis.UniversalClient{cc}
	for _, s := range srvs {
		c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	const name, ttl = "delayed-copy-cluster", 30 * time.Second
	warm, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("warm-up Acquire: %v", err)
	}
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatalf("warm-up Release: %v", err)
	}
	check := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { _ = check.Close() })
	clusterLocked := func() bool {
		n, err := check.Exists(ctxFor(t), lockKey(name)).Result()
		if err != nil {
			t.Fatalf("EXISTS on the cluster: %v", err)
		}
		return n == 1
	}

	// Node 1 held by another owner: the lease needs the cluster's grant.
	other := srvs[0].Client(t)
	if err := other.Set(ctxFor(t), lockKey(name), "another owner", ttl).Err(); err != nil {
		t.Fatal(err)
	}
	d.armed.Store(true)
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if d.armed.Load() {
		t.Fatal("the acquisition's first copy was not held back")
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for clusterLocked() {
		if time.Now().After(deadline) {
			t.Fatal("the cluster still holds the lock 5 s after Release")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	d.Let(t)
	if clusterLocked() {
		t.Errorf("after Release, the delayed first copy of the acquisition (resent by the ClusterClient) locked the cluster node again")
	}
	if err := other.Del(ctxFor(t), lockKey(name)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctxFor(t)); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Close: %v", err)
	}
}

// A failed try whose request to a node was sent twice, the copy that
// answered finding the lock held by another owner there: releaseTry sends
// nothing to a node that answered held, so no revocation mark is left
// there, and the delayed first copy, run once that owner has released the
// lock, takes it for its lease time, for nobody.
func TestDelayedAcquisitionCopyHeldNodeFailedTry(t *testing.T) {
	srvs := nodes(t, 3)
	acq, _ := redlock.ScriptHashes()
	d := &firstDelayer{match: []byte(acq)}
	opts := []*redis.Options{
		{Addr: srvs[0].Addr, ReadTimeout: 100 * time.Millisecond, Dialer: d.Dial},
		{Addr: srvs[1].Addr, MaxRetries: -1},
		{Addr: srvs[2].Addr, MaxRetries: -1},
	}
	l := lockerOver(t, opts...)
	const name, ttl = "delayed-copy-held-node", 30 * time.Second
	warmUp(t, l, srvs, name, ttl)

	// Nodes 0 and 1 held by another owner: the try fails as held once
	// node 0's second copy has answered.
	for _, s := range srvs[:2] {
		if err := s.Client(t).Set(ctxFor(t), lockKey(name), "another owner", ttl).Err(); err != nil {
			t.Fatal(err)
		}
	}
	d.armed.Store(true)
	_, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if !errors.Is(err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire with nodes 0 and 1 held = %v, want ErrNotAcquired", err)
	}
	if d.armed.Load() {
		t.Fatal("the acquisition's first copy was not held back")
	}
	waitUnlocked(t, srvs[2:], name, 5*time.Second) // the try's give-back
	if err := l.Close(ctxFor(t)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// The other owner releases node 0; the delayed copy then runs there.
	if err := srvs[0].Client(t).Del(ctxFor(t), lockKey(name)).Err(); err != nil {
		t.Fatal(err)
	}
	d.Let(t)
	if on := lockedOn(t, srvs[:1], name); len(on) != 0 {
		t.Errorf("after the failed try (%v), the delayed first copy of its acquisition locked node 0 once its holder released it", err)
	}
	if err := srvs[1].Client(t).Del(ctxFor(t), lockKey(name)).Err(); err != nil {
		t.Fatal(err)
	}
}
