package etcdlock_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/observetest"
)

// pastDeadlineLocker is a Locker on the shared server whose watchdog
// leases last a minute, and whose leases' runs are held (see HoldRuns).
func pastDeadlineLocker(t *testing.T, obs fence.Observer, log *slog.Logger) fence.Locker {
	l := newLocker(t, shared.Endpoints(), &etcdlock.Options{WatchdogTTL: time.Minute, Observer: obs, Logger: log})
	etcdlock.HoldRuns(l)
	return l
}

// TestObservedLeaseEndsAtDeadlineBeforeItsTimer: as redislock's and
// redlock's. A lease whose deadline has passed is lost, whether or not its
// run has started and picked its expiry timer's case. Err used to return
// only what run had recorded: in that gap Err said the lease was held,
// Done was open, and Release deleted the key and returned nil (reported
// Released). Each of Err, Context, Done, Release and Extend, called first,
// must end the lease as run would (LostExpired, or LostRenewFailed for a
// watchdog lease, with run's error), reported once by the time it
// returns; the others then agree.
func TestObservedLeaseEndsAtDeadlineBeforeItsTimer(t *testing.T) {
	for _, watchdog := range []bool{false, true} {
		for _, first := range []string{"Err", "Context", "Done", "Release", "Extend"} {
			t.Run(fmt.Sprintf("watchdog=%v/%s", watchdog, first), func(t *testing.T) {
				observetest.PastDeadlineEnds(t, observetest.PastDeadlineCase{
					New: func(t *testing.T, obs fence.Observer) fence.Locker {
						return pastDeadlineLocker(t, obs, nil)
					},
					Pass:       etcdlock.PassDeadline,
					Watchdog:   watchdog,
					First:      first,
					Expired:    `": expired`,
					NotRenewed: `": not renewed before its deadline`,
				})
			})
		}
	}
}

// TestReentryAtEndPastDeadline: see observetest.ReentryAtEndPastDeadline.
// The end of a lease past its deadline is reported by whichever call finds
// it; a callback that calls the lease back must not deadlock on it
// (Release and Extend wait for ls.op, Release for run) nor see it held.
func TestReentryAtEndPastDeadline(t *testing.T) {
	observetest.ReentryAtEndPastDeadline(t, observetest.PastDeadline{
		New:      pastDeadlineLocker,
		Pass:     etcdlock.PassDeadline,
		Triggers: []string{"Err", "Context", "Done", "Release", "Extend"},
	})
}
