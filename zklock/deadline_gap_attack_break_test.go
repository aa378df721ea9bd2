package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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

// TestErrAgreesWithLoweredDeadline: with WithSessionTimeouts, Deadline
// reads the session timeout as recorded now, so a grant that lowered it
// (or a new session, timeout 0) moves the Deadline at once, before the
// grant's retime has moved the lease's own deadline and timer (the
// SessionTimeouts retimes its leases one by one after it recorded the
// grant). In that moment the Deadline has passed, and Err, Done and
// Context, which end a lease past its deadline, must say so: a Release
// then deleted the node and returned nil (reported Released) for a lease
// whose Deadline said it was no longer known to be held.
func TestErrAgreesWithLoweredDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, st := exactConn(t, sharedZK(t).Addr, sessionTimeout)
	rec := &observetest.Recorder{}
	l, err := zklock.New(conn, sessionTimeout, zklock.WithSessionTimeouts(st), zklock.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	ls, err := l.Acquire(ctx, "deadline-gap:lowered")
	if err != nil {
		t.Fatal(err)
	}
	undo := st.LowerQuietly(time.Millisecond) // its retime not yet made
	defer undo()
	if left := time.Until(ls.Deadline()); left > 0 {
		t.Fatalf("Deadline %v from now with the timeout lowered to 1 ms", left)
	}
	if err := ls.Err(); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Err with the Deadline passed (the session timeout lowered, not yet retimed) = %v, want ErrLeaseLost", err)
	}
	if err := ls.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release = %v, want ErrLeaseLost", err)
	}
	if ends := rec.Ends(); len(ends) != 1 || ends[0].Cause != fence.LostRenewFailed {
		t.Errorf("ends %+v, want one, renew_failed", ends)
	}
}
