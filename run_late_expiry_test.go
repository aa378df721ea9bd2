package fence_test

import (
	"context"
	"errors"
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
// checking ctx.Err() before each write, still writes. fn's context now
// looks at the lease's Deadline itself (2 of 503 redislock hand-overs under
// -race had the new leader's fn start while the old fn's ctx said go, 6.6
// ms past the old Deadline); it needs a Deadline that never blocks, as a
// Locker may ask fn's context whether it is done while it holds the
// lease's lock (memlock's Extend does: a Deadline behind that lock hung
// TestLeadHungExtendEndsTermAtDeadline).
func TestRunCtxDoneAtLeaseDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMemlock(t)
		err := fence.Run(t.Context(), lateTimerLocker{m, 50 * time.Millisecond}, "late", func(ctx context.Context, lease fence.Lease) error {
			time.Sleep(time.Until(lease.Deadline()) + time.Millisecond)
			if ctx.Err() == nil {
				t.Errorf("fn's ctx not done %v past the lease's Deadline", time.Since(lease.Deadline()))
			} else if cause := context.Cause(ctx); !errors.Is(cause, fence.ErrLeaseLost) {
				t.Errorf("fn's ctx's cause = %v, want ErrLeaseLost", cause)
			}
			if lease.Context().Err() != nil {
				t.Errorf("the lease's Context (ended 50 ms late) had already ended: the test shows nothing")
			}
			<-ctx.Done()
			return nil
		}, fence.TTL(100*time.Millisecond))
		if err == nil {
			t.Fatal("Run = nil, want ErrLeaseLost")
		}
	})
}
