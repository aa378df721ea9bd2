package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

type ctxKey struct{}

// A lease whose holder never calls Done or Context has neither its context
// nor its expiry timer made; it must still end at its deadline as every
// lease does: Err reports it lost, Extend and Release say so, and a Done or
// Context asked for afterwards is already ended, with Err as the cause and
// the Acquire context's values. The Locker's clock is set a second back, so
// that a 500 ms lease's deadline has passed when Acquire returns.
func TestLeaseEndsAtDeadlineUnwatched(t *testing.T) {
	l := newLocker(t, nodes(t, 3), nil)
	redlock.SetClock(l, func() time.Time { return time.Now().Add(-time.Second) })
	ctx := context.WithValue(ctxFor(t), ctxKey{}, "v")
	for _, first := range []string{"Err", "Done", "Context"} {
		t.Run(first, func(t *testing.T) {
			lease, err := l.Acquire(ctx, "unwatched-"+first, fence.TTL(500*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			if !time.Now().After(lease.Deadline()) {
				t.Fatalf("deadline %v not passed", lease.Deadline())
			}
			switch first {
			case "Done":
				select {
				case <-lease.Done():
				default:
					t.Fatal("Done, asked for first past the deadline, is not closed")
				}
			case "Context":
				if lease.Context().Err() == nil {
					t.Fatal("Context, asked for first past the deadline, is not cancelled")
				}
			}
			err = lease.Err()
			if !errors.Is(err, fence.ErrLeaseLost) {
				t.Fatalf("Err past the deadline = %v, want ErrLeaseLost", err)
			}
			select {
			case <-lease.Done():
			default:
				t.Fatal("Done not closed past the deadline")
			}
			lctx := lease.Context()
			if cause := context.Cause(lctx); cause != err {
				t.Fatalf("Context cause = %v, want Err %v", cause, err)
			}
			if lctx.Value(ctxKey{}) != "v" {
				t.Fatal("Context lost the Acquire context's values")
			}
			if err := lease.Extend(ctxFor(t), time.Second); !errors.Is(err, fence.ErrLeaseLost) {
				t.Fatalf("Extend past the deadline = %v, want ErrLeaseLost", err)
			}
			if err := lease.Release(ctxFor(t)); !errors.Is(err, fence.ErrLeaseLost) {
				t.Fatalf("Release past the deadline = %v, want ErrLeaseLost", err)
			}
		})
	}
}

// A lease whose Done is asked for while it is held gets its expiry timer
// then: Done closes at the deadline without any other call.
func TestLeaseDoneClosesAtDeadline(t *testing.T) {
	l := newLocker(t, nodes(t, 3), nil)
	// A lease of 1 s, not less: Redlock refuses a grant that took most of
	// the lease time, and on a loaded machine three nodes' replies took
	// 98 ms of a 100 ms lease (CI, 2026-12-05: "no validity time left").
	lease, err := l.Acquire(ctxFor(t), "watched", fence.TTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed within 10 s of a 1 s lease")
	}
	if !time.Now().After(lease.Deadline()) {
		t.Fatalf("Done closed before the deadline %v", lease.Deadline())
	}
	if err := lease.Err(); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", err)
	}
}
