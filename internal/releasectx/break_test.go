package releasectx_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/releasectx"
)

// A ctx already cancelled by its lease's end when Release is called (a
// Release called again after one that failed: "calling Release again
// retries") must be detached too, or the retry with the lease's Context
// is cut short before it sends anything.
func TestDetachAlreadyReleased(t *testing.T) {
	parent, cancel := context.WithCancelCause(context.Background())
	cancel(fence.ErrReleased)
	d, stop := releasectx.Detach(parent, time.Now().Add(time.Minute))
	defer stop()
	if d.Err() != nil {
		t.Fatalf("a ctx already ended by its lease's release: detached Err = %v, cause %v", d.Err(), context.Cause(d))
	}
	select {
	case <-d.Done():
		t.Fatalf("cancelled: %v", context.Cause(d))
	case <-time.After(50 * time.Millisecond):
	}
}

// Already released, it still ends at its bound (here past: at once).
func TestDetachAlreadyReleasedPastBound(t *testing.T) {
	parent, cancel := context.WithCancelCause(context.Background())
	cancel(fence.ErrReleased)
	d, stop := releasectx.Detach(parent, time.Now().Add(-time.Second))
	defer stop()
	select {
	case <-d.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("not ended at a bound already past")
	}
	if !errors.Is(context.Cause(d), context.DeadlineExceeded) {
		t.Errorf("cause %v", context.Cause(d))
	}
}

// A cause that wraps ErrReleased, and a ctx whose deadline passed with a
// cause: kept as the user set them.
func TestDetachCauses(t *testing.T) {
	t.Run("deadline-passed-before", func(t *testing.T) {
		c, cancel := context.WithTimeout(context.Background(), -time.Second)
		defer cancel()
		d, stop := releasectx.Detach(c, time.Now().Add(time.Minute))
		defer stop()
		if !errors.Is(d.Err(), context.DeadlineExceeded) {
			t.Errorf("Err %v", d.Err())
		}
	})
	t.Run("earlier-deadline-after-release", func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.Background())
		c, cancelT := context.WithTimeout(parent, 30*time.Millisecond)
		defer cancelT()
		d, stop := releasectx.Detach(c, time.Now().Add(time.Hour))
		defer stop()
		cancel(fence.ErrReleased)
		select {
		case <-d.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the user's deadline did not end it")
		}
		if !errors.Is(d.Err(), context.DeadlineExceeded) {
			t.Errorf("Err %v", d.Err())
		}
	})
	t.Run("user-cause-after-deadline-check", func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.Background())
		d, stop := releasectx.Detach(parent, time.Now().Add(time.Hour))
		defer stop()
		why := fmt.Errorf("other: %w", context.Canceled)
		cancel(why)
		select {
		case <-d.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("not cancelled")
		}
		if context.Cause(d) != why {
			t.Errorf("cause %v", context.Cause(d))
		}
	})
}

// stop racing the AfterFunc (and the bound's timer) under -race, many times.
func TestDetachStopRaces(t *testing.T) {
	for i := 0; i < 500; i++ {
		parent, cancel := context.WithCancelCause(context.Background())
		if i%2 == 1 {
			cancel(fence.ErrReleased) // already released: its AfterFunc runs at once
		}
		d, stop := releasectx.Detach(parent, time.Now().Add(time.Duration(i%3)*time.Microsecond))
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); cancel(fence.ErrReleased) }()
		go func() { defer wg.Done(); stop() }()
		wg.Wait()
		stop() // twice: harmless
		<-d.Done()
	}
}

// custom is a Context that the context package cannot see through: its
// AfterFunc needs a goroutine, which stop must end (goleak in TestMain).
type custom struct{ context.Context }

func (c custom) Done() <-chan struct{} { return c.Context.Done() }

func TestDetachCustomContextNoLeak(t *testing.T) {
	for _, release := range []bool{false, true} {
		parent, cancel := context.WithCancelCause(context.Background())
		d, stop := releasectx.Detach(custom{parent}, time.Now().Add(time.Hour))
		if release {
			cancel(fence.ErrReleased)
			select {
			case <-d.Done():
				t.Fatalf("cancelled by the release: %v", context.Cause(d))
			case <-time.After(20 * time.Millisecond):
			}
		}
		stop()
		cancel(nil)
		<-d.Done()
	}
}
