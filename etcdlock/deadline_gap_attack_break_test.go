package etcdlock_test

import (
	"fmt"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/observetest"
)

// gapAttack is observetest's GapAttack for etcdlock, runs held.
var gapAttack = observetest.GapAttack{
	New: func(t *testing.T, obs fence.Observer) fence.Locker {
		return pastDeadlineLocker(t, obs, nil)
	},
	Pass: etcdlock.PassDeadline,
	Set:  etcdlock.SetDeadline,
}

// TestConcurrentCallsPastDeadline: see
// observetest.ConcurrentCallsPastDeadline. Eight goroutines find a lease
// past its deadline at once (Release and Extend among them, which wait for
// ls.op and give the etcd lease back), the Observer calls it back: one
// end, reported by the one that made it before it returned, and every
// call says lost.
func TestConcurrentCallsPastDeadline(t *testing.T) {
	for _, watchdog := range []bool{false, true} {
		t.Run(fmt.Sprintf("watchdog=%v", watchdog), func(t *testing.T) {
			observetest.ConcurrentCallsPastDeadline(t, gapAttack, watchdog)
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
