package fence_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// lateLocker returns each lease once its deadline has passed, as
// redislock's Acquire does when the try that took the lock is answered
// more than the lease time after it was sent (the lease's deadline counts
// from the send): a redis-server starved on a loaded machine, or paused.
type lateLocker struct{ fence.Locker }

func (l lateLocker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	lease, err := l.Locker.Acquire(ctx, name, opts...)
	if err == nil {
		time.Sleep(time.Until(lease.Deadline()) + time.Millisecond) // the bubble's clock
		synctest.Wait()
	}
	return lease, err
}

// Run (and so Lead) calls fn with a lease that ended before Acquire
// returned. TestLeadRedis's removals found no lock right after a term
// began ("removal 1: new leader a after 37ms", then DEL = 0, in a loaded
// run); with the server paused 500 ms while a candidate's try was on its
// way, the new leader's lease ended "not renewed before its deadline" 6
// ms into its term, and Run's Release deleted the lock. No safety is lost
// (fn's ctx is done from the start, the lock was held on the server, and
// the token is the newest), but a term is started, and told to stop,
// for nothing.
func TestRunLeaseEndedBeforeFn(t *testing.T) {
	t.Skip("design question: Acquire (redislock's, and any backend's whose reply can come after the deadline) returns a lease already ended, and Run and Lead call fn with it, its ctx done at once. " +
		"The fix I would choose: redislock's Acquire treats a take whose reply came after the lease's deadline as a try given up on (gives the lock back, revoked, and tries again within the wait budget, or returns ErrNotAcquired wrapping the late reply), " +
		"and Run returns ErrNotAcquired (after the Release) rather than call fn with a lease whose Err is already set; Lead then campaigns again with the lost-lease pause")
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		called := false
		err := fence.Run(t.Context(), lateLocker{l}, "late", func(ctx context.Context, lease fence.Lease) error {
			called = true
			if lerr := lease.Err(); lerr != nil {
				t.Errorf("fn called with a lease that had already ended: %v", lerr)
			}
			return nil
		}, fence.TTL(time.Second))
		t.Logf("Run = %v, fn called: %v", err, called)
	})
}
