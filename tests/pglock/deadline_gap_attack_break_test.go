package pglock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/pglock"
)

// gapAttack is observetest's GapAttack for pglock on d.
func gapAttack(t *testing.T, d database) observetest.GapAttack {
	return observetest.GapAttack{
		New: func(t *testing.T, obs fence.Observer) fence.Locker {
			return d.lockerWith(t, d.db, pglock.Options{Observer: obs, WatchdogTTL: time.Minute})
		},
		Pass: passDeadline,
		Set:  func(fl fence.Lease, at time.Time) { leaseOf(t, fl).setDeadline(t, at) },
	}
}

// TestConcurrentCallsPastDeadline: see
// observetest.ConcurrentCallsPastDeadline. Eight goroutines find a lease
// past its deadline at once (Release and Extend among them, which wait for
// ls.op), the Observer calls it back: one end, reported by the one that
// made it before it returned, and every call says lost.
func TestConcurrentCallsPastDeadline(t *testing.T) {
	d := newDatabase(t, pg)
	for _, watchdog := range []bool{false, true} {
		t.Run(fmt.Sprintf("watchdog=%v", watchdog), func(t *testing.T) {
			observetest.ConcurrentCallsPastDeadline(t, gapAttack(t, d), watchdog)
		})
	}
}

// TestHeldLeaseCallsDoNotAllocate: see
// observetest.HeldLeaseCallsDoNotAllocate.
func TestHeldLeaseCallsDoNotAllocate(t *testing.T) {
	observetest.HeldLeaseCallsDoNotAllocate(t, gapAttack(t, newDatabase(t, pg)))
}

// TestReleasedThenPastDeadline: see observetest.ReleasedThenPastDeadline.
func TestReleasedThenPastDeadline(t *testing.T) {
	d := newDatabase(t, pg)
	for _, failFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("failFirst=%v", failFirst), func(t *testing.T) {
			observetest.ReleasedThenPastDeadline(t, gapAttack(t, d), failFirst)
		})
	}
}
