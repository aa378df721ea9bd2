package memlock_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// Durations at the top of their range (math.MaxInt64: 292 years) overflow
// when added to the clock. A lease with such a TTL, Extend or watchdog TTL
// must be held, with a Deadline after now (not one wrapped into the past),
// and a waiter with such a budget must still end with its ctx.
func TestHugeDurations(t *testing.T) {
	const huge = time.Duration(math.MaxInt64)
	synctest.Test(t, func(t *testing.T) {
		wd, err := memlock.New(&memlock.Options{WatchdogTTL: huge})
		if err != nil {
			t.Fatal(err)
		}
		l, _ := memlock.New(nil)
		for _, c := range []struct {
			name string
			l    *memlock.Locker
			opts []fence.Option
		}{
			{"TTL", l, []fence.Option{fence.TTL(huge)}},
			{"watchdog", wd, nil},
		} {
			lease, err := c.l.Acquire(t.Context(), c.name, c.opts...)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			time.Sleep(time.Hour) // synctest: fake time
			if !lease.Deadline().After(time.Now()) || lease.Err() != nil {
				t.Errorf("%s %v: Deadline %v (now %v), Err %v; want held", c.name, huge, lease.Deadline(), time.Now(), lease.Err())
			}
			if err := lease.Extend(t.Context(), huge); err != nil || !lease.Deadline().After(time.Now()) || lease.Err() != nil {
				t.Errorf("%s: Extend(%v) = %v; Deadline %v, Err %v", c.name, huge, err, lease.Deadline(), lease.Err())
			}
			time.Sleep(time.Hour)
			if lease.Err() != nil {
				t.Errorf("%s: lost after Extend(%v): %v", c.name, huge, lease.Err())
			}

			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			_, err = c.l.Acquire(ctx, c.name, fence.Wait(huge))
			cancel()
			if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: Acquire with Wait(%v) = %v, want ctx's deadline", c.name, huge, err)
			}
			if err := lease.Release(t.Context()); err != nil {
				t.Errorf("%s: Release = %v", c.name, err)
			}
		}
	})
}
