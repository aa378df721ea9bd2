package memlock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

type recorder struct {
	fence.NopObserver
	mu       sync.Mutex
	acquires []fence.AcquireResult
	ends     []fence.LeaseCause
}

func (r *recorder) AcquireDone(e fence.AcquireEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acquires = append(r.acquires, e.Result)
}

func (r *recorder) LeaseEnded(e fence.LeaseEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ends = append(r.ends, e.Cause)
}

// TestObserver: results and causes as the Observer sees them.
func TestObserver(t *testing.T) {
	rec := &recorder{}
	l, err := memlock.New(&memlock.Options{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, err := l.Acquire(ctx, "a", fence.TTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "a"); !errors.Is(err, fence.ErrHeld) {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Acquire(cancelled, "a"); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, ""); !errors.Is(err, fence.ErrInvalidName) {
		t.Fatal(err)
	}
	l.Remove("a")
	<-a.Done()
	b, err := l.Acquire(ctx, "b", fence.TTL(fence.MinTTL), fence.Wait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	<-b.Done()
	// The expiry is reported by the lease's timer once it has unlocked
	// the Locker, after Done closed: wait for it, or c's release may be
	// reported first.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) { // polling with a deadline
		rec.mu.Lock()
		n := len(rec.ends)
		rec.mu.Unlock()
		if n >= 2 || time.Now().After(deadline) {
			break
		}
	}
	c, err := l.Acquire(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if want := []fence.AcquireResult{fence.Acquired, fence.Held, fence.Cancelled, fence.Acquired, fence.Acquired}; !slices.Equal(rec.acquires, want) {
		t.Errorf("results %v, want %v", rec.acquires, want)
	}
	if want := []fence.LeaseCause{fence.LostRemoved, fence.LostExpired, fence.Released}; !slices.Equal(rec.ends, want) {
		t.Errorf("causes %v, want %v", rec.ends, want)
	}
}
