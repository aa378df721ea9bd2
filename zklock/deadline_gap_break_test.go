package zklock_test

import (
	"fmt"
	"log/slog"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/zklock"
)

// pastDeadlineLocker is a Locker on the shared server with obs as its
// Observer, or log as its Logger.
func pastDeadlineLocker(t *testing.T, obs fence.Observer, log *slog.Logger) fence.Locker {
	var opts []zklock.Option
	if obs != nil {
		opts = append(opts, zklock.WithObserver(obs))
	}
	if log != nil {
		opts = append(opts, zklock.WithLogger(log))
	}
	l, err := zklock.New(connect(t, []string{sharedZK(t).Addr}, nil), sessionTimeout, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestObservedLeaseEndsAtDeadlineBeforeItsTimer: as redislock's and
// redlock's. A lease whose deadline has passed is lost, whether or not its
// expiry timer's goroutine has run yet. Err used to return only what the
// timer had recorded: in that gap Err said the lease was held, Done was
// open, and Release deleted the node and returned nil (reported
// Released). Each of Err, Context, Done, Release and Extend, called first,
// must end the lease as the timer would (LostExpired when its fence.TTL
// ran out; a lease without one, which lives as long as its session, as
// LostRenewFailed: no reply for a session timeout), reported once by the
// time it returns; the others then agree.
func TestObservedLeaseEndsAtDeadlineBeforeItsTimer(t *testing.T) {
	for _, session := range []bool{false, true} {
		for _, first := range []string{"Err", "Context", "Done", "Release", "Extend"} {
			t.Run(fmt.Sprintf("session=%v/%s", session, first), func(t *testing.T) {
				observetest.PastDeadlineEnds(t, observetest.PastDeadlineCase{
					New: func(t *testing.T, obs fence.Observer) fence.Locker {
						return pastDeadlineLocker(t, obs, nil)
					},
					Pass:       zklock.PassDeadline,
					Watchdog:   session,
					First:      first,
					Expired:    "its lease time ran out",
					NotRenewed: "no reply from ZooKeeper for a session timeout",
				})
			})
		}
	}
}

// TestReentryAtEndPastDeadline: see observetest.ReentryAtEndPastDeadline
// (its "watchdog" leases are session leases here). The end of a lease past
// its deadline is reported by whichever call finds it; a callback that
// calls the lease back must not deadlock on it (Release waits for the
// Release under way and for the monitor) nor see it held.
func TestReentryAtEndPastDeadline(t *testing.T) {
	observetest.ReentryAtEndPastDeadline(t, observetest.PastDeadline{
		New:      pastDeadlineLocker,
		Pass:     zklock.PassDeadline,
		Triggers: []string{"Err", "Context", "Done", "Release", "Extend"},
	})
}

// TestCallRacesExpiry: the expiry timer and the first of Err or Release
// find the deadline passed at about the same moment (it is moved a few
// microseconds away): the lease ends once, and what is reported agrees
// with what Err and Release returned; see observetest.CallRacesExpiry.
func TestCallRacesExpiry(t *testing.T) {
	for _, first := range []string{"Err", "Release"} {
		t.Run(first, func(t *testing.T) {
			observetest.CallRacesExpiry(t, observetest.ExpiryRace{
				New: func(t *testing.T, obs fence.Observer) fence.Locker {
					return pastDeadlineLocker(t, obs, nil)
				},
				Soon:    zklock.Soon,
				Expired: "its lease time ran out",
			}, first)
		})
	}
}

// TestReleaseAsDeadlineMovesReportsOnce: see
// observetest.ReleaseAsDeadlineMoves. Release's checks of the deadline race
// a goroutine that moves it as the monitor's replies and Extends do.
func TestReleaseAsDeadlineMovesReportsOnce(t *testing.T) {
	observetest.ReleaseAsDeadlineMoves(t, observetest.DeadlineFlip{
		New: func(t *testing.T, obs fence.Observer) fence.Locker {
			return pastDeadlineLocker(t, obs, nil)
		},
		Set: zklock.SetDeadline,
	})
}
