package memlock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// tokenRecorder records the tokens of the leases Acquire returned and of
// the leases whose end was reported.
type tokenRecorder struct {
	fence.NopObserver
	mu       sync.Mutex
	acquired map[fence.Token]bool
	ended    []fence.LeaseEvent
}

func (r *tokenRecorder) AcquireDone(e fence.AcquireEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.Result == fence.Acquired {
		if r.acquired == nil {
			r.acquired = map[fence.Token]bool{}
		}
		r.acquired[e.Token] = true
	}
}

func (r *tokenRecorder) LeaseEnded(e fence.LeaseEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = append(r.ended, e)
}

// phantoms returns the reported ends of leases that no Acquire returned.
func (r *tokenRecorder) phantoms() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.ended {
		if !r.acquired[e.Token] {
			out = append(out, fmt.Sprintf("token %d %s", e.Token, e.Cause))
		}
	}
	return out
}

// A waiter handed the lock whose goroutine wakes after the lease's time
// (TestWaiterWokeAfterLeaseTime's stall) gets no lease, and the Observer
// sees no acquisition of it; but the lease handed over, which nobody ever
// held, was reported ended ("expired", by its timer or by the waiter's
// check): an end without an acquisition, counted as a lost lease.
func TestWaiterWokeLateNoPhantomEnd(t *testing.T) {
	for _, wait := range []time.Duration{10 * time.Second, 120 * time.Millisecond} {
		t.Run("wait="+wait.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const ttl = 100 * time.Millisecond
				rec := &tokenRecorder{}
				l, err := New(&Options{Observer: rec})
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
				got := make(chan fence.Lease, 1)
				go func() {
					ls, _ := l.Acquire(t.Context(), "late", fence.TTL(ttl), fence.Wait(wait))
					got <- ls
				}()
				synctest.Wait() // queued
				if err := holder.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
				if ls := <-got; ls != nil {
					if err := ls.Release(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
				if p := rec.phantoms(); len(p) > 0 {
					t.Fatalf("ends reported of leases no Acquire returned: %v", p)
				}
			})
		})
	}
}
