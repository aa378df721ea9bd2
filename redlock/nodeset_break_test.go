package redlock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
)

// Two Lockers that share some nodes but not the whole set (a deployment
// whose node list was changed on some clients only: 3 nodes on one, 5 on
// the other; or 3 and 3 that overlap on one node) have majorities that need
// not intersect: with a stale lock left on one shared node (which the
// package allows: a client that exits without Close leaves a minority
// locked), both hold the name at once, each lease's Err nil, neither
// refused. New cannot see another Locker's list; refusing it would take a
// record of the node set on every node (written at first contact, checked
// by every acquisition), a design decision.
func TestLockersOverDifferentNodeSets(t *testing.T) {
	t.Skip("bug: Lockers over different but overlapping node sets both hold a name at once; " +
		"detecting it needs the node set recorded on the nodes, a design decision")
	srvs := nodes(t, 5)
	for _, c := range []struct {
		name  string
		a, b  []int // each Locker's nodes
		stale int   // the shared node locked by a stale owner during A's Acquire
	}{
		{name: "3-of-5", a: []int{0, 1, 2}, b: []int{0, 1, 2, 3, 4}, stale: 2},
		{name: "overlap-1", a: []int{0, 1, 2}, b: []int{2, 3, 4}, stale: 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			pick := func(idx []int) []*redistest.Server {
				var out []*redistest.Server
				for _, i := range idx {
					out = append(out, srvs[i])
				}
				return out
			}
			a := newLocker(t, pick(c.a), &redlock.Options{NodeTimeout: generous})
			b := newLocker(t, pick(c.b), &redlock.Options{NodeTimeout: generous})
			name := "node-sets-" + c.name
			// A stale minority lock, left by a client that exited
			// without Close, runs out soon.
			if err := srvs[c.stale].Client(t).Set(ctxFor(t), lockKey(name), "stale", 300*time.Millisecond).Err(); err != nil {
				t.Fatal(err)
			}
			la, err := a.Acquire(ctxFor(t), name, fence.TTL(30*time.Second))
			if err != nil {
				t.Fatalf("A's Acquire: %v", err)
			}
			defer la.Release(ctxFor(t))
			var lb fence.Lease
			deadline := time.Now().Add(5 * time.Second)
			for lb == nil && time.Now().Before(deadline) {
				lb, _ = b.Acquire(ctxFor(t), name, fence.TTL(30*time.Second), fence.Wait(time.Second))
			}
			if lb == nil {
				return // refused: safe
			}
			defer lb.Release(ctxFor(t))
			if la.Err() == nil && lb.Err() == nil {
				t.Errorf("two holders of %q: A (nodes %v) token %d and B (nodes %v) token %d, both Err nil",
					name, c.a, la.Token(), c.b, lb.Token())
			}
		})
	}
}
