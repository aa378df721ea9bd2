package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

type ctxKey struct{}

// A lease whose holder never calls Done or Context has neither its context
// nor its expiry timer made; it must still end at its deadline as every
// lease does: Err reports it lost, Extend and Release say so, and a Done or
// Context asked for afterwards is already ended, with Err as the cause and
// the Acquire context's values.
func TestLeaseEndsAtDeadlineUnwatched(t *testing.T) {
	l := newLocker(t, nodes(t, 3), nil)
	ctx := context.WithValue(ctxFor(t), ctxKey{}, "v")
	lease, err := l.Acquire(ctx, "unwatched", fence.TTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Err(); err != nil {
		t.Fatalf("Err while held: %v", err)
	}
	// Polled, with a deadline: nothing else tells an unwatched lease ended.
	for limit := time.Now().Add(5 * time.Second); lease.Err() == nil; {
		if time.Now().After(limit) {
			t.Fatal("Err still nil 5 s into a 100 ms lease")
		}
		time.Sleep(time.Millisecond) // a poll interval, not a wait for time to pass
	}
	if now := time.Now(); now.Before(lease.Deadline()) {
		t.Fatalf("lease ended at %v, before its deadline %v", now, lease.Deadline())
	}
	err = lease.Err()
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Err after the deadline = %v, want ErrLeaseLost", err)
	}
	select {
	case <-lease.Done():
	default:
		t.Fatal("Done not closed after the deadline")
	}
	lctx := lease.Context()
	if cause := context.Cause(lctx); cause != err {
		t.Fatalf("Context cause = %v, want Err %v", cause, err)
	}
	if lctx.Value(ctxKey{}) != "v" {
		t.Fatal("Context lost the Acquire context's values")
	}
	if err := lease.Extend(ctxFor(t), time.Second); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend after the deadline = %v, want ErrLeaseLost", err)
	}
	if err := lease.Release(ctxFor(t)); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release after the deadline = %v, want ErrLeaseLost", err)
	}
}

// A lease whose Done is asked for while it is held gets its expiry timer
// then: Done closes at the deadline without any other call.
func TestLeaseDoneClosesAtDeadline(t *testing.T) {
	l := newLocker(t, nodes(t, 3), nil)
	lease, err := l.Acquire(ctxFor(t), "watched", fence.TTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed within 5 s of a 100 ms lease")
	}
	if !time.Now().After(lease.Deadline()) {
		t.Fatalf("Done closed before the deadline %v", lease.Deadline())
	}
	if err := lease.Err(); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", err)
	}
}
