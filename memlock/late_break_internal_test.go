package memlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// A waiter stalled (testHookWaiting) until both the lease handed to it
// and its budget have run out finds both ready: select picks one at
// random. Picking the budget, it found itself out of the queue, took the
// lease handed over and returned it, already ended.
func TestWaiterWokeLateAtBudgetEnd(t *testing.T) {
	const ttl, wait = 100 * time.Millisecond, 120 * time.Millisecond
	for i := range 40 {
		synctest.Test(t, func(t *testing.T) {
			l, err := New(nil)
			if err != nil {
				t.Fatal(err)
			}
			holder, err := l.Acquire(t.Context(), "late", fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			release := make(chan struct{})
			testHookWaiting = func() {
				close(release)
				time.Sleep(wait + ttl) // the bubble's clock: past both
			}
			defer func() { testHookWaiting = nil }()
			type result struct {
				lease fence.Lease
				err   error
			}
			got := make(chan result, 1)
			go func() {
				ls, err := l.Acquire(t.Context(), "late", fence.TTL(ttl), fence.Wait(wait))
				got <- result{ls, err}
			}()
			<-release
			if err := holder.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			r := <-got
			if r.lease != nil {
				defer r.lease.Release(context.Background()) //nolint:errcheck // the verdict is on Err
				t.Fatalf("run %d: Acquire returned a lease, Err = %v; want ErrNotAcquired", i, r.lease.Err())
			}
			if !errors.Is(r.err, fence.ErrNotAcquired) {
				t.Fatalf("run %d: Acquire = %v, want ErrNotAcquired", i, r.err)
			}
			if !strings.Contains(r.err.Error(), "too late") && !errors.Is(r.err, fence.ErrHeld) {
				t.Fatalf("run %d: Acquire = %v, want it to say it woke too late", i, r.err)
			}
		})
	}
}
