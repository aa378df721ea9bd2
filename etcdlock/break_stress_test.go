package etcdlock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/stresstest"
)

// Holders that Extend and Release at once, with contexts cancelled at
// random moments, on one lock: never two holders at once, tokens
// increasing, every lease ended once its Release returned, and each end
// reported once, as Release's result says (see stresstest.RandomCancels).
func TestRandomCancelsNeverTwoHolders(t *testing.T) {
	endpoints := shared.Endpoints()
	stresstest.RandomCancels(t, 3*time.Second, func(t *testing.T, obs fence.Observer) fence.Locker {
		return newLocker(t, endpoints, &etcdlock.Options{WatchdogTTL: watchdogTTL, Observer: obs})
	})
}

// Two fence.Lead candidates whose ctx is cancelled at random moments, in
// rounds (see stresstest.LeadCancels): each Lead returns promptly, terms
// never overlap, tokens grow, and the lock is free once both returned (the
// lease time being 30 s, a key a cancelled campaign left would show).
func TestLeadCancelledAtRandom(t *testing.T) {
	endpoints := shared.Endpoints()
	stresstest.LeadCancels(t, 40, newLocker(t, endpoints, nil), newLocker(t, endpoints, nil), 2*time.Second, 5*time.Second)
}

// fence.Run's fn finds its context done once the lease's Done is closed,
// whether the lease ran out or its key was deleted (see
// stresstest.RunCtxDoneWithLease).
func TestRunCtxDoneWithLease(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	stresstest.RunCtxDoneWithLease(t, newLocker(t, endpoints, &etcdlock.Options{WatchdogTTL: watchdogTTL}), 50, func(t testing.TB, name string) {
		removeHolder(t, admin, name)
	})
}
