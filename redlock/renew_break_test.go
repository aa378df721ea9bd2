package redlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// A lease granted on nodes 0 and 1 of 3, its acquisition on node 2 lost on
// the way (so node 2 is one whose grant never came, and Release revokes
// it). The lease then loses node 0 (its lock gone, as after a restart
// without persistence), and another Locker acquires on nodes 0 and 2, a
// majority, while the first lease says held. The first lease's Release deletes its lock only on node
// 1: node 2 answers 0 because the other owner holds it there, which is no
// free node. Release must report the lease lost (only one node still held
// it), not nil.
func TestReleaseRevokedNodeHeldByOtherIsNotFreed(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "release-revoked-taken", 30 * time.Second
	drop := &slowAcquire{drop: true}
	cs := clientsWith(t, srvs, lateOptions, nil, nil, drop)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: lateNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
	warm := acquireFast(t, l, name, ttl) // scripts loaded, connections made
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	waitUnlocked(t, srvs, name, 5*time.Second)
	other := lateLocker(t, srvs, name)
	drop.armed.Store(true)
	lease := acquireFast(t, l, name, ttl)
	if on := lockedOn(t, srvs, name); len(on) != 2 || on[1] != 1 {
		t.Fatalf("locked on %v, want nodes 0 and 1", on)
	}
	// Node 0 loses the lease's lock.
	if err := srvs[0].Client(t).Del(ctxFor(t), lockKey(name)).Err(); err != nil {
		t.Fatal(err)
	}
	taker := acquireFast(t, other, name, ttl)
	defer func() { _ = taker.Release(ctxFor(t)) }()
	if lease.Err() != nil {
		t.Fatalf("first lease ended before Release: %v", lease.Err())
	}
	err = lease.Release(ctxFor(t))
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of a lease whose lock another Locker holds on nodes 0 and 2 = %v, want ErrLeaseLost", err)
	}
	if taker.Err() != nil {
		t.Fatalf("the other lease ended: %v", taker.Err())
	}
}
