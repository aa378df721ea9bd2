package releasectx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/releasectx"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type key struct{}

func TestDetach(t *testing.T) {
	t.Run("released", func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), key{}, 1))
		d, stop := releasectx.Detach(parent, time.Time{})
		defer stop()
		cancel(fence.ErrReleased)
		<-parent.Done()
		// The AfterFunc runs on a goroutine of its own: a cancellation
		// it passed on would show within a moment.
		select {
		case <-d.Done():
			t.Fatalf("cancelled with ctx as its lease was released: %v", context.Cause(d))
		case <-time.After(50 * time.Millisecond):
		}
		if d.Value(key{}) != 1 {
			t.Error("values lost")
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.Background())
		d, stop := releasectx.Detach(parent, time.Time{})
		defer stop()
		why := errors.New("shutting down")
		cancel(why)
		<-d.Done()
		if !errors.Is(d.Err(), context.Canceled) || context.Cause(d) != why {
			t.Errorf("Err %v, cause %v", d.Err(), context.Cause(d))
		}
	})
	t.Run("deadline", func(t *testing.T) {
		parent, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		d, stop := releasectx.Detach(parent, time.Time{})
		defer stop()
		<-d.Done()
		if !errors.Is(d.Err(), context.DeadlineExceeded) {
			t.Errorf("Err %v", d.Err())
		}
		if dl, _ := parent.Deadline(); !dl.Equal(func() time.Time { x, _ := d.Deadline(); return x }()) {
			t.Error("deadline not kept")
		}
	})
	t.Run("released-before-deadline", func(t *testing.T) {
		parent, cancel := context.WithCancelCause(context.Background())
		timed, cancelT := context.WithTimeout(parent, 20*time.Millisecond)
		defer cancelT()
		d, stop := releasectx.Detach(timed, time.Time{})
		defer stop()
		cancel(fence.ErrReleased)
		<-d.Done()
		if !errors.Is(d.Err(), context.DeadlineExceeded) {
			t.Errorf("Err %v, want the deadline's", d.Err())
		}
	})
	t.Run("bound", func(t *testing.T) {
		// Released, the context ends at the bound (the lease's
		// deadline), not never: a Release on a hung server returns.
		parent, cancel := context.WithCancelCause(context.Background())
		d, stop := releasectx.Detach(parent, time.Now().Add(20*time.Millisecond))
		defer stop()
		cancel(fence.ErrReleased)
		select {
		case <-d.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("not ended at its bound")
		}
		if !errors.Is(context.Cause(d), context.DeadlineExceeded) {
			t.Errorf("cause %v, want one matching context.DeadlineExceeded", context.Cause(d))
		}
	})
	t.Run("as-is", func(t *testing.T) {
		bg := context.Background()
		if d, stop := releasectx.Detach(bg, time.Time{}); d != bg {
			t.Error("Background wrapped")
		} else {
			stop()
		}
		done, cancel := context.WithCancel(bg)
		cancel()
		if d, stop := releasectx.Detach(done, time.Time{}); d != done {
			t.Error("a done ctx wrapped")
		} else {
			stop()
		}
	})
}
