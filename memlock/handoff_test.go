package memlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/memlock"
)

// A waiter whose wait ends (its ctx cancelled) just as Release hands it
// the lock gets an error, and the lease it was handed is released at once.
// That lease was never granted to anyone (Acquire reported it as not
// acquired): the Observer must not be told it ended, or LeaseEnded counts
// a lease that no AcquireDone counted. Every end reported belongs to an
// acquired lease, once.
func TestHandoffToGoneWaiterNotReported(t *testing.T) {
	rec := &observetest.Recorder{}
	l, err := memlock.New(&memlock.Options{Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	const name = "handoff"
	for range 2000 {
		a, err := l.Acquire(context.Background(), name, fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan fence.Lease, 1)
		queued := make(chan struct{})
		go func() {
			close(queued)
			b, err := l.Acquire(ctx, name, fence.TTL(time.Minute), fence.Wait(time.Minute))
			if err != nil {
				b = nil
			}
			got <- b
		}()
		<-queued
		go cancel()
		if err := a.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if b := <-got; b != nil {
			if err := b.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
	}
	acquired := map[fence.Token]bool{}
	for _, e := range rec.Acquires() {
		if e.Result == fence.Acquired {
			acquired[e.Token] = true
		}
	}
	ended := map[fence.Token]int{}
	for _, e := range rec.Ends() {
		ended[e.Token]++
		if !acquired[e.Token] {
			t.Errorf("end of token %d reported (%s), but no Acquire returned it", e.Token, e.Cause)
		}
	}
	for tok := range acquired {
		if ended[tok] != 1 {
			t.Errorf("token %d: %d ends reported, want 1", tok, ended[tok])
		}
	}
}

// reacquirer takes the lock again from LeaseEnded, on the goroutine that
// ended the lease, and releases it.
type reacquirer struct {
	fence.NopObserver
	l    atomic.Pointer[memlock.Locker]
	done chan error
}

func (r *reacquirer) LeaseEnded(ev fence.LeaseEvent) {
	l := r.l.Swap(nil)
	if l == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := l.Acquire(ctx, ev.Name, fence.Wait(time.Second))
	if err == nil {
		err = b.Release(ctx)
	}
	r.done <- err
}

// An Observer told that a lease ended (by Release, or by its expiry timer)
// acquires the same name on the same Locker: the lock is free by then.
func TestObserverReacquires(t *testing.T) {
	for _, expire := range []bool{false, true} {
		r := &reacquirer{done: make(chan error, 1)}
		l, err := memlock.New(&memlock.Options{Observer: r})
		if err != nil {
			t.Fatal(err)
		}
		r.l.Store(l)
		a, err := l.Acquire(context.Background(), "again", fence.TTL(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if !expire {
			if err := a.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("expire=%v: Acquire and Release from LeaseEnded = %v", expire, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("expire=%v: the callback did not return within 10s (deadlock?)", expire)
		}
	}
}
