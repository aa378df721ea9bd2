package fence_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// hungLocker's leases have an Extend that hangs until its ctx ends (a
// server that stopped answering), without extending anything.
type hungLocker struct{ fence.Locker }

type hungLease struct{ fence.Lease }

func (h hungLocker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	l, err := h.Locker.Acquire(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	return hungLease{l}, nil
}

func (hungLease) Extend(ctx context.Context, _ time.Duration) error {
	<-ctx.Done()
	return context.Cause(ctx)
}

// A leader with a fixed lease time that keeps it by Extend, whose Extend
// hangs past the lease's deadline: the lease ends at its deadline, fn's
// context (which the hung Extend was given) with it, and the other
// candidate's term starts only after that: never while the old leader's
// context still says go.
func TestLeadHungExtendEndsTermAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var mu sync.Mutex
		var old context.Context
		var oldDeadline time.Time
		started := make(chan string, 2)
		fn := func(who string) func(context.Context, fence.Lease) error {
			return func(fctx context.Context, lease fence.Lease) error {
				mu.Lock()
				if old != nil && old.Err() == nil {
					t.Errorf("%s's term started while the old leader's ctx was not done", who)
				}
				if !oldDeadline.IsZero() && time.Now().Before(oldDeadline) {
					t.Errorf("%s's term started %v before the old lease's deadline", who, time.Until(oldDeadline))
				}
				old, oldDeadline = fctx, lease.Deadline()
				mu.Unlock()
				started <- who
				for fctx.Err() == nil {
					if err := lease.Extend(fctx, time.Second); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
						return err
					}
				}
				return nil
			}
		}
		lead := func(who string, locker fence.Locker) {
			_ = fence.Lead(ctx, locker, "leader", fn(who), fence.LeaseOptions(fence.TTL(time.Second), fence.Wait(time.Hour)))
		}
		var wg sync.WaitGroup
		wg.Go(func() { lead("hung", hungLocker{l}) })
		if who := <-started; who != "hung" {
			t.Fatalf("%s led first", who)
		}
		wg.Go(func() { lead("other", l) })
		if who := <-started; who != "other" {
			t.Fatalf("%s led second", who)
		}
		cancel()
		wg.Wait()
	})
}
