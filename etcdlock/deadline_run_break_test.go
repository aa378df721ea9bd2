package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// fence.Run ends fn's context once the lease's Deadline has passed, maybe
// before the lease's run loop sees its expiry timer; fn returns at once and
// Run releases the lease. Run's error must match ErrLeaseLost, as for a
// lease the Locker found expired (on pglock it was nil: see
// tests/pglock's test of this name; here it held before that fix too).
func TestRunEndedAtDeadlineReportsLeaseLost(t *testing.T) {
	l := newLocker(t, []string{exampleEndpoint}, nil)
	for round := range 2 {
		name := fmt.Sprintf("deadline-run-%d", round)
		var cause error
		err := fence.Run(ctxFor(t, time.Minute), l, name, func(ctx context.Context, lease fence.Lease) error {
			limit := time.Now().Add(10 * time.Second)
			for ctx.Err() == nil && time.Now().Before(limit) {
			}
			cause = context.Cause(ctx)
			return nil
		}, fence.TTL(time.Second))
		if !errors.Is(cause, fence.ErrLeaseLost) {
			t.Fatalf("round %d: fn's ctx's cause = %v, want ErrLeaseLost", round, cause)
		}
		if !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("round %d: fn's ctx ended at the lease's Deadline (%v), yet Run = %v, want an error matching ErrLeaseLost", round, cause, err)
		}
	}
}
