package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// A Release whose deletes have not reached a majority when its lease's
// Deadline passes reports the lease lost (it ran out), not ErrNoQuorum,
// which asks for a retry that could only find the lock gone. A retry made
// after the deadline, while the first call's deletes were still out (two
// nodes of three hung), waited for them until its ctx ended and returned
// ErrNoQuorum again, however long past the deadline.
func TestReleaseRetryPastDeadlineWhileDeletesOut(t *testing.T) {
	srvs := nodes(t, 3)
	l, err := redlock.New(hangable(t, srvs), &redlock.Options{NodeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	warm, err := l.Acquire(ctxFor(t), "retry-past-deadline-warm", fence.TTL(time.Second)) // dials, loads the scripts
	if err != nil {
		t.Fatalf("warm-up Acquire: %v", err)
	}
	if err := warm.Release(ctxFor(t)); err != nil {
		t.Fatalf("warm-up Release: %v", err)
	}
	// The lease's validity is timed from 800 ms before the acquisition:
	// its deadline comes about 190 ms after it, and the deletes, bounded
	// by its lease time less the drift, are out until well after that.
	redlock.SetClock(l, func() time.Time { return time.Now().Add(-800 * time.Millisecond) })
	lease, err := l.Acquire(ctxFor(t), "retry-past-deadline", fence.TTL(time.Second))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	resume := pause(t, srvs[1:])
	defer resume()
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := lease.Release(short); !errors.Is(err, redlock.ErrNoQuorum) || time.Now().After(lease.Deadline()) {
		t.Skipf("first Release = %v, %v after the deadline: the machine is too slow for this test", err, time.Since(lease.Deadline()))
	}
	<-time.After(time.Until(lease.Deadline()) + 10*time.Millisecond) // the deadline passes, the deletes still out
	retry, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	err = lease.Release(retry)
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release retried %v after the deadline, the first call's deletes still out = %v, want ErrLeaseLost (ran out)",
			time.Since(lease.Deadline()).Round(time.Millisecond), err)
	}
	resume()
	waitUnlocked(t, srvs, "retry-past-deadline", 5*time.Second)
}
