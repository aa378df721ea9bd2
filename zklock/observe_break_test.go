package zklock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/zklock"
)

// A Release that fails (its ctx done) ends the lease as released, one
// LeaseEnded, as in every backend; Release again deletes the node and
// reports nothing more; the lock is free at once.
func TestObserverFailedReleaseIsReleased(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	rec := &observetest.Recorder{}
	l, err := zklock.New(connect(t, addrs, nil), sessionTimeout, zklock.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease, err := l.Acquire(ctx, "rel")
	if err != nil {
		t.Fatal(err)
	}
	done, cancelDone := context.WithCancel(ctx)
	cancelDone()
	if err := lease.Release(done); err == nil {
		t.Log("Release with a done ctx succeeded")
	}
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease still held 5 s after a failed Release")
	}
	if err := lease.Err(); !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("Err after a failed Release = %v, want ErrReleased", err)
	}
	if ends := rec.WaitEnds(t, 1, 5*time.Second); ends[0].Cause != fence.Released {
		t.Fatalf("LeaseEnded %+v, want released", ends[0])
	}
	if err := lease.Release(ctx); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release again: %v", err)
	}
	next, err := l.Acquire(ctx, "rel", fence.Wait(5*time.Second))
	if err != nil {
		t.Fatalf("Acquire after the retried Release: %v", err)
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ends := rec.Ends(); len(ends) != 2 || ends[1].Cause != fence.Released {
		t.Fatalf("LeaseEnded events %+v, want two released", ends)
	}
}
