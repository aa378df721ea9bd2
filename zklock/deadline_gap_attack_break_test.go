package zklock_test

import (
	"fmt"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/zklock"
)

// gapAttack is observetest's GapAttack for zklock ("watchdog" leases are
// session leases here).
var gapAttack = observetest.GapAttack{
	New: func(t *testing.T, obs fence.Observer) fence.Locker {
		return pastDeadlineLocker(t, obs, nil)
	},
	Pass: zklock.PassDeadline,
	Set:  zklock.SetDeadline,
}

// TestConcurrentCallsPastDeadline: see
// observetest.ConcurrentCallsPastDeadline. Eight goroutines find a lease
// past its deadline at once (Release among them, which waits for the
// Release under way and the monitor), the Observer calls it back: one end,
// reported by the one that made it before it returned, and every call says
// lost.
func TestConcurrentCallsPastDeadline(t *testing.T) {
	for _, session := range []bool{false, true} {
		t.Run(fmt.Sprintf("session=%v", session), func(t *testing.T) {
			observetest.ConcurrentCallsPastDeadline(t, gapAttack, session)
		})
	}
}

// TestHeldLeaseCallsDoNotAllocate: see
// observetest.HeldLeaseCallsDoNotAllocate.
func TestHeldLeaseCallsDoNotAllocate(t *testing.T) {
	observetest.HeldLeaseCallsDoNotAllocate(t, gapAttack)
}

// TestReleasedThenPastDeadline: see observetest.ReleasedThenPastDeadline.
func TestReleasedThenPastDeadline(t *testing.T) {
	for _, failFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("failFirst=%v", failFirst), func(t *testing.T) {
			observetest.ReleasedThenPastDeadline(t, gapAttack, failFirst)
		})
	}
}
