package fence_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// fence.Backoff(100, 10_000), the units forgotten, is 100 ns to 10 µs:
// before, Lead accepted it and campaigned against a backend that fails at
// once about 10⁵ times a second (10,000 campaigns in a few milliseconds of
// the test's clock). A back-off under time.Millisecond (1 ms) is now
// refused with ErrInvalidOption naming it, as a TTL under MinTTL is.
func TestLeadBackoffUnitsForgotten(t *testing.T) {
	for _, b := range [][2]time.Duration{{100, 10_000}, {1, time.Second}, {fence.MinBackoff - 1, time.Second}} {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			c := &countingLocker{limit: 10000, stop: cancel} // a backend that is down
			start := time.Now()
			err := fence.Lead(ctx, c, "leader", func(context.Context, fence.Lease) error { return nil }, fence.Backoff(b[0], b[1]))
			if !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), b[0].String()) {
				t.Fatalf("Lead with Backoff(%v, %v) = %v after %d campaigns in %v; want ErrInvalidOption naming %v",
					b[0], b[1], err, c.n.Load(), time.Since(start), b[0])
			}
		})
	}
	// MinBackoff itself is accepted.
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		c := &countingLocker{limit: 10000, stop: cancel}
		if err := fence.Lead(ctx, c, "leader", func(context.Context, fence.Lease) error { return nil },
			fence.Backoff(fence.MinBackoff, fence.MinBackoff)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lead with Backoff(MinBackoff, MinBackoff) = %v, want ctx's deadline", err)
		}
	})
}
