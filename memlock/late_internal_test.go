package memlock

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// A waiter handed the lock by a release, whose goroutine wakes only after
// the lease's time has run out (a stalled process; here a hook that sleeps
// on the bubble's clock): Acquire returned that lease, already ended. Now
// the waiter waits in line again within its budget and gets a live lease,
// or, with no budget left, returns ErrNotAcquired saying it woke too late.
func TestWaiterWokeAfterLeaseTime(t *testing.T) {
	for _, wait := range []time.Duration{10 * time.Second, 120 * time.Millisecond} {
		t.Run("wait="+wait.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const ttl = 100 * time.Millisecond
				l, err := New(nil)
				if err != nil {
					t.Fatal(err)
				}
				holder, err := l.Acquire(t.Context(), "late", fence.TTL(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				var once atomic.Bool
				testHookGranted = func() {
					if once.CompareAndSwap(false, true) {
						time.Sleep(ttl + 50*time.Millisecond) // the bubble's clock
					}
				}
				defer func() { testHookGranted = nil }()
				type result struct {
					lease fence.Lease
					err   error
				}
				got := make(chan result, 1)
				go func() {
					ls, err := l.Acquire(t.Context(), "late", fence.TTL(ttl), fence.Wait(wait))
					got <- result{ls, err}
				}()
				synctest.Wait() // queued
				if err := holder.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
				r := <-got
				if r.lease != nil {
					defer r.lease.Release(context.Background()) //nolint:errcheck // the verdict is on Err
				}
				if wait > ttl+50*time.Millisecond {
					if r.err != nil {
						t.Fatalf("Acquire with budget left: %v", r.err)
					}
					if lerr := r.lease.Err(); lerr != nil {
						t.Fatalf("Acquire returned a lease already ended: %v", lerr)
					}
					return
				}
				if r.lease != nil {
					t.Fatalf("Acquire returned a lease, Err = %v; want ErrNotAcquired", r.lease.Err())
				}
				if !errors.Is(r.err, fence.ErrNotAcquired) || !strings.Contains(r.err.Error(), "too late") {
					t.Fatalf("Acquire = %v, want ErrNotAcquired saying it woke too late", r.err)
				}
			})
		})
	}
}
