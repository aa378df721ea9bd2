package pglock_test

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/pglock"
)

type recorder struct {
	fence.NopObserver
	mu       sync.Mutex
	acquires []fence.AcquireResult
	ends     map[string]fence.LeaseCause
}

func (r *recorder) AcquireDone(e fence.AcquireEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acquires = append(r.acquires, e.Result)
}

func (r *recorder) LeaseEnded(e fence.LeaseEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ends[e.Name] = e.Cause
}

// TestObserver: a lease whose row is deleted behind its holder's back ends
// as removed, a released one as released; a held lock is reported held.
func TestObserver(t *testing.T) {
	d := newDatabase(t, pg)
	rec := &recorder{ends: map[string]fence.LeaseCause{}}
	l, err := pglock.New(d.db, &pglock.Options{WatchdogTTL: watchdogTTL, Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 30*time.Second)
	lost, err := l.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "job"); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("second Acquire: %v", err)
	}
	d.remove(t, "job")
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
	if rec.ends["job"] != fence.LostRemoved || rec.ends["other"] != fence.Released {
		t.Errorf("causes %v", rec.ends)
	}
}
