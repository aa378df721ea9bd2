package redlock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/stresstest"
	"github.com/fencekit/fence/redlock"
)

// Holders that Extend and Release at once, with contexts cancelled at
// random moments, on one lock over 3 nodes: never two holders at once,
// tokens increasing, every lease ended once its Release returned, and each
// end reported once, as Release's result says (see
// stresstest.RandomCancels).
func TestRandomCancelsNeverTwoHolders(t *testing.T) {
	srvs := nodes(t, 3)
	stresstest.RandomCancels(t, 3*time.Second, func(t *testing.T, obs fence.Observer) fence.Locker {
		return newLocker(t, srvs, &redlock.Options{WatchdogTTL: 300 * time.Millisecond, NodeTimeout: generous, Observer: obs})
	})
}

// Two fence.Lead candidates whose ctx is cancelled at random moments, in
// rounds (see stresstest.LeadCancels), on three masters: each Lead returns
// promptly, terms never overlap, tokens grow, and the lock is free once
// both returned (the lease time being 30 s, a node's lock that a cancelled
// campaign left would show).
func TestLeadCancelledAtRandom(t *testing.T) {
	srvs := nodes(t, 3)
	var ls []fence.Locker
	for range 2 {
		l, err := redlock.New(clients(t, srvs), nil)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	stresstest.LeadCancels(t, 40, ls[0], ls[1], 2*time.Second, 5*time.Second)
}

// fence.Run's fn finds its context done once the lease's Done is closed,
// whether the lease ran out or its lock was deleted on every node (see
// stresstest.RunCtxDoneWithLease).
func TestRunCtxDoneWithLease(t *testing.T) {
	srvs := nodes(t, 3)
	stresstest.RunCtxDoneWithLease(t, newLocker(t, srvs, &redlock.Options{WatchdogTTL: 300 * time.Millisecond, NodeTimeout: generous}), 50, func(t testing.TB, name string) {
		for _, s := range srvs {
			if err := s.Client(t).Del(t.Context(), lockKey(name)).Err(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
		}
	})
}
