package fence_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// A term that ran long and returned nil (a leader that hands over every
// hour, say) counts as an early return "in a row" like a fn that fails at
// once: the pause after it grows with each such term and reaches the
// maximum back-off after seven, and a lone candidate leaves the lock
// unheld for up to that long (10 s by default) at every handover. A
// supervisor usually forgets a failure after a stretch of healthy running
// (Kubernetes' restart back-off resets after 10 minutes).
//
// A term that lasted longer than the maximum back-off now ends the row, as
// a lost lease does: the guard against a fn that returns at once is kept
// (TestLeadEarlyReturnBacksOff).
func TestLeadLongTermsDoNotGrowBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var starts []time.Time
		done := make(chan error, 1)
		go func() {
			done <- fence.Lead(ctx, l, "leader", func(ctx context.Context, _ fence.Lease) error {
				starts = append(starts, time.Now())
				if len(starts) == 10 {
					cancel()
				}
				select {
				case <-time.After(time.Hour):
				case <-ctx.Done():
				}
				return nil
			})
		}()
		<-done
		for i := 1; i < len(starts); i++ {
			if gap := starts[i].Sub(starts[i-1]) - time.Hour; gap > fence.DefaultMinBackoff {
				t.Errorf("term %d began %v after an hour-long term ended, want at most the minimum back-off %v", i, gap, fence.DefaultMinBackoff)
			}
		}
	})
}
