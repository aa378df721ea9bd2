package zklock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/stresstest"
	"github.com/fencekit/fence/zklock"
)

// Holders that Extend and Release at once, with contexts cancelled at
// random moments, on one lock: never two holders at once, tokens
// increasing, every lease ended once its Release returned, and each end
// reported once, as Release's result says (see stresstest.RandomCancels).
func TestRandomCancelsNeverTwoHolders(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	stresstest.RandomCancels(t, 3*time.Second, func(t *testing.T, obs fence.Observer) fence.Locker {
		l, err := zklock.New(connect(t, addrs, nil), sessionTimeout, zklock.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		return l
	})
}

// Two fence.Lead candidates whose ctx is cancelled at random moments, in
// rounds (see stresstest.LeadCancels): each Lead returns promptly, terms
// never overlap, tokens grow, and the lock is free once both returned (a
// node a cancelled campaign left would live as long as its session).
func TestLeadCancelledAtRandom(t *testing.T) {
	srv := startZK(t)
	a, _ := newLocker(t, []string{srv.Addr})
	b, _ := newLocker(t, []string{srv.Addr})
	stresstest.LeadCancels(t, 40, a, b, 2*time.Second, 5*time.Second)
}

// fence.Run's fn finds its context done once the lease's Done is closed,
// whether the lease ran out or its node was deleted (see
// stresstest.RunCtxDoneWithLease).
func TestRunCtxDoneWithLease(t *testing.T) {
	srv := startZK(t)
	l, _ := newLocker(t, []string{srv.Addr})
	admin := connect(t, []string{srv.Addr}, nil)
	stresstest.RunCtxDoneWithLease(t, l, 50, func(t testing.TB, name string) {
		nodes := lockNodes(t, admin, name)
		if len(nodes) == 0 {
			t.Fatalf("no node for %q", name)
		}
		if err := admin.Delete(nodes[0], -1); err != nil {
			t.Fatal(err)
		}
	})
}
