package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// fence.Run ends fn's context once the lease's Deadline has passed, before
// pglock's expiry timer ends the lease (it reads only that timer's
// verdict): fn, which checks ctx.Err() in a loop, sees its ctx done with a
// cause matching ErrLeaseLost and returns; Run's Release then finds the
// row still the lease's (the database's expiry is later than the local
// Deadline) and frees it, the lease's Err says released. Run's error must
// still match ErrLeaseLost, as its doc says of a lease lost while fn ran
// (and as it does on redislock, redlock and memlock, whose Err looks at
// the Deadline), and Lead must count the term as lost.
func TestRunEndedAtDeadlineReportsLeaseLost(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	for round := range 5 {
		name := fmt.Sprintf("deadline-run-%d", round)
		var cause error
		err := fence.Run(t.Context(), l, name, func(ctx context.Context, lease fence.Lease) error {
			limit := time.Now().Add(10 * time.Second)
			for ctx.Err() == nil && time.Now().Before(limit) {
			}
			cause = context.Cause(ctx)
			return nil
		}, fence.TTL(100*time.Millisecond))
		if !errors.Is(cause, fence.ErrLeaseLost) {
			t.Fatalf("round %d: fn's ctx's cause = %v, want ErrLeaseLost", round, cause)
		}
		if !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("round %d: fn's ctx ended at the lease's Deadline (%v), yet Run = %v, want an error matching ErrLeaseLost", round, cause, err)
		}
	}
}
