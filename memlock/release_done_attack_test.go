package memlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// TestReleaseDoneThenNewOwner (held): after a Release with a done ctx, a
// watchdog lease and a fixed one keep their lock to the deadline and no
// later (a waiter with a shorter budget is refused, one with a longer
// budget gets it with a greater token); past the deadline a new owner
// takes it, and the old lease's retried Release returns ErrLeaseLost and
// leaves the new owner's lock held.
func TestReleaseDoneThenNewOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		done, cancel := context.WithCancel(context.Background())
		cancel()
		for _, opts := range [][]fence.Option{{fence.TTL(time.Minute)}, nil} {
			l := newLocker(t, 30*time.Second)
			old := mustAcquire(t, l, "n", opts...)
			deadline := old.Deadline()
			if err := old.Release(done); !errors.Is(err, context.Canceled) {
				t.Fatalf("Release(done) = %v", err)
			}
			if _, err := l.Acquire(context.Background(), "n", fence.Wait(time.Until(deadline)-time.Second)); !errors.Is(err, fence.ErrHeld) {
				t.Fatalf("opts %v: a waiter whose budget ends before the deadline: %v, want ErrHeld", opts, err)
			}
			time.Sleep(time.Until(deadline) + time.Millisecond) // the bubble's clock
			next := mustAcquire(t, l, "n", fence.TTL(time.Hour))
			if next.Token() <= old.Token() {
				t.Fatalf("token %d after %d", next.Token(), old.Token())
			}
			if err := old.Release(context.Background()); !errors.Is(err, fence.ErrLeaseLost) {
				t.Fatalf("opts %v: old Release retried with another owner = %v, want ErrLeaseLost", opts, err)
			}
			if next.Err() != nil {
				t.Fatalf("opts %v: the old lease's retried Release ended the new owner's lease: %v", opts, next.Err())
			}
			if _, err := l.Acquire(context.Background(), "n"); !errors.Is(err, fence.ErrHeld) {
				t.Fatalf("opts %v: the old lease's retried Release freed the new owner's lock: %v", opts, err)
			}
			mustRelease(t, next)
		}
	})
}

// TestExtendRacesReleaseDone (held): Extend and Release(done) and a
// retried Release of one lease from several goroutines, in real time under
// -race: the lease ends released, Extend after the end fails with
// ErrLeaseLost, and the lock is free once a retried Release returned nil.
func TestExtendRacesReleaseDone(t *testing.T) {
	l := newLocker(t, time.Second)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for range 200 {
		lease := mustAcquire(t, l, "n", fence.TTL(time.Minute))
		var wg sync.WaitGroup
		wg.Go(func() { _ = lease.Extend(context.Background(), time.Hour) })
		wg.Go(func() { _ = lease.Release(done) })
		wg.Go(func() { _ = lease.Extend(context.Background(), time.Minute) })
		wg.Wait()
		if !errors.Is(lease.Err(), fence.ErrReleased) {
			t.Fatalf("Err %v after Release(done)", lease.Err())
		}
		if err := lease.Extend(context.Background(), time.Hour); !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Extend after Release(done) = %v", err)
		}
		if err := lease.Release(context.Background()); err != nil {
			t.Fatalf("retried Release = %v", err)
		}
	}
	mustRelease(t, mustAcquire(t, l, "n"))
}
