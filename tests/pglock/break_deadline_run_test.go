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

// Lead on the same: each term's fn returns when its ctx ends at the lease's
// Deadline. A term that ends so is a lost lease, as one ended by the
// Locker's timer is: Lead campaigns again after the shortest back-off. It
// counted it as an early return (the lease's Err says released), and its
// back-off doubled at every term.
func TestLeadTermEndedAtDeadlineIsNoFailure(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	const terms, minBackoff = 5, 50 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var deposed time.Time
	var gaps []time.Duration
	var causes []error
	err := fence.Lead(ctx, l, "deadline-lead", func(ctx context.Context, lease fence.Lease) error {
		limit := time.Now().Add(10 * time.Second)
		for ctx.Err() == nil && time.Now().Before(limit) {
		}
		causes = append(causes, context.Cause(ctx))
		return ctx.Err()
	}, fence.Backoff(minBackoff, time.Hour), fence.OnElected(func(fence.Lease) {
		if !deposed.IsZero() {
			gaps = append(gaps, time.Since(deposed))
		}
		if len(gaps) == terms-1 {
			cancel()
		}
	}), fence.OnDeposed(func(fence.Lease, error) { deposed = time.Now() }),
		fence.LeaseOptions(fence.TTL(100*time.Millisecond)))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Lead = %v, want context.Canceled", err)
	}
	for i, c := range causes[:len(causes)-1] { // the last ended with ctx
		if !errors.Is(c, fence.ErrLeaseLost) {
			t.Fatalf("term %d: fn's ctx's cause = %v, want ErrLeaseLost", i, c)
		}
	}
	// After a lost lease the pause is at most minBackoff; as failures
	// in a row it doubles: 8 times it after the fourth.
	for i, g := range gaps {
		if g > 5*minBackoff {
			t.Fatalf("pause after term %d: %v (all: %v), want about %v at most: the term was counted as a failure", i, g, gaps, minBackoff)
		}
	}
}
