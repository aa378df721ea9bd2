package memlock_test

import (
	"context"
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
