package fence_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// lateTimerLocker's leases end (Context, Done, Err) late: lateBy after their
// Deadline, as a backend's expiry timer that fires late does on a loaded
// machine (a GC pause, a descheduled process). Nothing else is wrong.
type lateTimerLocker struct {
	fence.Locker
	lateBy time.Duration
}

type lateTimerLease struct {
	fence.Lease
	ctx context.Context
}

func (l lateTimerLocker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	lease, err := l.Locker.Acquire(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	late, cancel := context.WithCancelCause(context.WithoutCancel(lease.Context()))
	context.AfterFunc(lease.Context(), func() {
		time.AfterFunc(l.lateBy, func() { cancel(context.Cause(lease.Context())) })
	})
	return lateTimerLease{lease, late}, nil
}

func (l lateTimerLease) Context() context.Context { return l.ctx }
func (l lateTimerLease) Done() <-chan struct{}    { return l.ctx.Done() }

// A fixed lease whose expiry is noticed late (the Locker's timer fires
// 50 ms after the Deadline): fn's context still says go after the lease's
// Deadline, the local time before which the lease is known to be held. The
// server's expiry is only 1% plus 2 ms later than that Deadline (redislock,
// redlock): past it another candidate can be elected while the old fn,
// checking ctx.Err() before each write, still writes.
func TestRunCtxDoneAtLeaseDeadline(t *testing.T) {
	t.Skip("design question: fn's context ends when the Locker's timer ends the lease, which on a loaded machine fires " +
		"after the lease's Deadline (the server's expiry is only 1% + 2 ms later on Redis: two redislock Lockers in one " +
		"process, fixed 20 ms leases, under -race, had the new leader's fn start while the old fn's ctx was not done " +
		"in 2 of 503 hand-overs, 6.6 ms past the old Deadline); fn's ctx.Err() could also " +
		"compare time.Now() with lease.Deadline() (a mutex in every backend's Deadline, on each Err, Done and Value: " +
		"costly where ctx.Err() is called in a loop; a cached deadline is wrong after an Extend that shortens it). " +
		"I would check the Deadline in workCtx.Err only (not Done or Value), cancelling with ErrLeaseLost, and say so in Run's doc. " +
		"Tried (2026-12-03) and reverted: a backend may call ctx.Err() on fn's context while it holds its own lease's lock (memlock's Extend does), " +
		"and Err calling lease.Deadline() then waits for that lock for ever (TestLeadHungExtendEndsTermAtDeadline hung); a cached deadline " +
		"is wrong after an Extend, so this needs a Deadline that never blocks in every Locker (an atomic), a contract change")
	synctest.Test(t, func(t *testing.T) {
		m := newMemlock(t)
		err := fence.Run(t.Context(), lateTimerLocker{m, 50 * time.Millisecond}, "late", func(ctx context.Context, lease fence.Lease) error {
			time.Sleep(time.Until(lease.Deadline()) + time.Millisecond)
			if ctx.Err() == nil {
				t.Errorf("fn's ctx not done %v past the lease's Deadline", time.Since(lease.Deadline()))
			}
			<-ctx.Done()
			return nil
		}, fence.TTL(100*time.Millisecond))
		if err == nil {
			t.Fatal("Run = nil, want ErrLeaseLost")
		}
	})
}
