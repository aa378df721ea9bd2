package redislock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/stresstest"
	"github.com/fencekit/fence/redislock"
)

// Holders that Extend and Release at once, with contexts cancelled at
// random moments, on one lock: never two holders at once, tokens
// increasing, every lease ended once its Release returned, and each end
// reported once, as Release's result says (see stresstest.RandomCancels).
func TestRandomCancelsNeverTwoHolders(t *testing.T) {
	srv := redistest.Start(t)
	stresstest.RandomCancels(t, 3*time.Second, func(t *testing.T, obs fence.Observer) fence.Locker {
		return newLockerWith(t, srv.Client(t), redislock.Options{Observer: obs})
	})
}

// fence.Run's fn finds its context done once the lease's Done is closed,
// whether the lease ran out or its lock was deleted (see
// stresstest.RunCtxDoneWithLease).
func TestRunCtxDoneWithLease(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	stresstest.RunCtxDoneWithLease(t, newLocker(t, srv.Client(t)), 50, func(t testing.TB, name string) {
		admin.Del(t.Context(), lockKey(name))
	})
}
