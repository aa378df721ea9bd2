package redlock_test

import (
	"testing"
	"time"
)

// A renewal for 30 s moves the lock on node 0 only (nodes 1 and 2 lose
// theirs on the way): no majority, the deadline stays, and node 0 is
// recorded as ahead. A later renewal for 1 s reaches every node and moves
// the deadline; node 0 answers moved, but its lock keeps the 30 s expiry
// (extend.lua only moves it later, GT). The lease then runs out at its
// 1 s deadline, unreleased: node 0, 29 s ahead of it, must be given back
// like any node a failed renewal moved, so that once Close returned nil
// nothing is locked past the acquisition's 5 s. (Clearing ahead for every node the later renewal
// "moved" left node 0 locked for ~28 s after Close returned nil.)
func TestShorterRenewalAfterAheadGivenBack(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "shorter-renewal-after-ahead"
	l, gates := gatedLocker(t, srvs)
	lease := warmLease(t, l, name, 5*time.Second)
	gates[1].drop.Store(true)
	gates[2].drop.Store(true)
	if err := lease.Extend(ctxFor(t), 30*time.Second); err == nil {
		t.Fatal("Extend on a minority returned nil")
	}
	if err := lease.Extend(ctxFor(t), time.Second); err != nil {
		t.Fatalf("Extend on every node: %v", err)
	}
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	if took, err := closeWithin(l, 10*time.Second); err != nil {
		t.Fatalf("Close (after %v): %v", took, err)
	}
	// Nodes 1 and 2 may keep the lock until the acquisition's 5 s run out
	// (a renewal never shortens it); nothing may stay longer.
	for _, i := range lockedOn(t, srvs, name) {
		pttl, _ := srvs[i].Client(t).PTTL(ctxFor(t), lockKey(name)).Result()
		if pttl > 5*time.Second {
			t.Errorf("node %d locked for %v more after the lease ran out and Close returned nil", i, pttl)
		}
	}
}
