package fence_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// Locks are not re-entrant (README, like sync.Mutex): a Run nested in fn
// on the same name does not take the lock again. With no wait it fails at
// once with ErrHeld; with a wait it fails with ErrHeld when the budget runs
// out, not later, and the outer lease is untouched; and the inner Run's
// ctx ending (the outer lease lost) ends that wait at once.
func TestRunNestedOnSameNameIsHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		err := fence.Run(t.Context(), l, "x", func(ctx context.Context, outer fence.Lease) error {
			inner := func(context.Context, fence.Lease) error {
				t.Error("inner fn ran: the lock was taken twice")
				return nil
			}
			if err := fence.Run(ctx, l, "x", inner); !errors.Is(err, fence.ErrHeld) {
				t.Errorf("nested Run, no wait = %v, want ErrHeld", err)
			}
			start := time.Now()
			if err := fence.Run(ctx, l, "x", inner, fence.Wait(time.Minute)); !errors.Is(err, fence.ErrHeld) || time.Since(start) != time.Minute {
				t.Errorf("nested Run, Wait 1m = %v after %v, want ErrHeld after 1m", err, time.Since(start))
			}
			if outer.Err() != nil {
				t.Errorf("outer lease ended by the nested Runs: %v", outer.Err())
			}
			start = time.Now()
			go func() { time.Sleep(time.Second); l.Remove("x") }() // synctest: fake time
			if err := fence.Run(ctx, l, "x", inner, fence.Wait(time.Hour)); !errors.Is(err, fence.ErrNotAcquired) || time.Since(start) > time.Second {
				t.Errorf("nested Run after the outer lease was lost = %v after %v, want ErrNotAcquired after 1s", err, time.Since(start))
			}
			return nil
		})
		if !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("outer Run = %v, want ErrLeaseLost (the lock was removed)", err)
		}
	})
}
