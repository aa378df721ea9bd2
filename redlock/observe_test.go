package redlock_test

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

type recorder struct {
	fence.NopObserver
	mu       sync.Mutex
	acquires []fence.AcquireResult
	ends     []fence.LeaseEvent
}

func (r *recorder) AcquireDone(e fence.AcquireEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acquires = append(r.acquires, e.Result)
}

func (r *recorder) LeaseEnded(e fence.LeaseEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ends = append(r.ends, e)
}

// TestObserver: a lease whose lock is deleted on a majority of the nodes
// ends as removed; one released, as released; a second Acquire of a held
// lock, as held.
func TestObserver(t *testing.T) {
	srvs := nodes(t, 3)
	rec := &recorder{}
	l := newLocker(t, srvs, &redlock.Options{WatchdogTTL: 2 * time.Second, NodeTimeout: 500 * time.Millisecond, Observer: rec})
	ctx := ctxFor(t)
	lost, err := l.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "job"); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("second Acquire: %v", err)
	}
	for _, s := range srvs[:2] {
		if err := s.Client(t).Del(ctx, lockKey("job")).Err(); err != nil {
			t.Fatal(err)
		}
	}
	<-lost.Done()
	kept, err := l.Acquire(ctx, "other", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := kept.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		rec.mu.Lock()
		n := len(rec.ends)
		rec.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d lease ends reported, want 2", n)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if want := []fence.AcquireResult{fence.Acquired, fence.Held, fence.Acquired}; !slices.Equal(rec.acquires, want) {
		t.Errorf("results %v, want %v", rec.acquires, want)
	}
	causes := map[string]fence.LeaseCause{}
	for _, e := range rec.ends {
		causes[e.Name] = e.Cause
		if e.Backend != "redlock" || e.Held <= 0 {
			t.Errorf("event %+v", e)
		}
	}
	if causes["job"] != fence.LostRemoved || causes["other"] != fence.Released {
		t.Errorf("causes %v", causes)
	}
}
