package redlock_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// releaser is an Observer that releases the lease whose end it is told, as
// a holder's "on lease lost, release and clean up" would, and sends what
// Release returned.
type releaser struct {
	fence.NopObserver
	lease chan fence.Lease // the lease to release, handed over once held
	done  chan error
}

func (r *releaser) LeaseEnded(fence.LeaseEvent) {
	select {
	case lease := <-r.lease:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r.done <- lease.Release(ctx)
	default: // not the lease under test (or told already)
	}
}

// The lock is deleted on two of three nodes, not all: the watchdog's
// renewal finds it gone on a majority, ends the lease and gives back node
// 2, and the Observer, told on the watchdog's goroutine, calls Release,
// which waits for the watchdog to be done. It returns ErrLeaseLost, and
// no node keeps the lock. Before the fix, the renewal reported the end
// before the watchdog was done, and the Release in the callback waited for
// it for ever.
func TestObserverReleasesOnLossFoundByRenewal(t *testing.T) {
	srvs := nodes(t, 3)
	r := &releaser{lease: make(chan fence.Lease, 1), done: make(chan error, 1)}
	l := newLocker(t, srvs, &redlock.Options{WatchdogTTL: 300 * time.Millisecond, NodeTimeout: generous, Observer: r})
	const name = "reentry-majority"
	lease, err := l.Acquire(ctxFor(t), name)
	if err != nil {
		t.Fatal(err)
	}
	r.lease <- lease
	for _, s := range srvs[:2] {
		if err := s.Client(t).Del(ctxFor(t), lockKey(name)).Err(); err != nil {
			t.Fatalf("DEL: %v", err)
		}
	}
	select {
	case err := <-r.done:
		if !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Release from LeaseEnded = %v, want ErrLeaseLost", err)
		}
	case <-time.After(10 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("Release from LeaseEnded did not return within 10s (deadlock?); goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	}
	if err := lease.Err(); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", err)
	}
	if on := lockedOn(t, srvs, name); len(on) != 0 {
		t.Fatalf("still locked on nodes %v after the loss and the Release", on)
	}
}
