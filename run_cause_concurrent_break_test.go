package fence_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// deadlineKept is a Context of its own that reports a deadline it never
// keeps: its Done is never closed (as the doc of Run's cause allows, at
// most causeWait, 1 s, to be read).
type deadlineKept struct {
	context.Context
	at   time.Time
	done chan struct{}
}

func (c deadlineKept) Deadline() (time.Time, bool) { return c.at, true }
func (c deadlineKept) Done() <-chan struct{}       { return c.done }
func (c deadlineKept) Err() error                  { return nil }

// TestRunCtxDeadlineCauseReadersInBubble: fn's context's cause read by
// several goroutines at once (a log line each, %v) inside a synctest
// bubble, with a ctx that never ends at its deadline. The cause was
// resolved under a sync.Once: one reader waited on the 1 s cap's timer,
// the others on the Once's mutex, which synctest does not count as
// durably blocked, so the bubble's clock never advanced and every reader
// hung for good (the test's real-time bound fired). Each reader now waits
// on channels alone; all read DeadlineExceeded after the 1 s cap.
func TestRunCtxDeadlineCauseReadersInBubble(t *testing.T) {
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		synctest.Test(t, func(t *testing.T) {
			l := newMemlock(t)
			ctx := deadlineKept{Context: context.Background(), at: time.Now().Add(time.Second), done: make(chan struct{})}
			_ = fence.Run(ctx, l, "n", func(fctx context.Context, _ fence.Lease) error {
				<-fctx.Done()
				start := time.Now()
				var wg sync.WaitGroup
				got := make([]string, 8)
				for i := range got {
					wg.Go(func() { got[i] = fmt.Sprintf("%v", context.Cause(fctx)) })
				}
				wg.Wait()
				for i, g := range got {
					if g != context.DeadlineExceeded.Error() {
						t.Errorf("reader %d: cause %q, want %q", i, g, context.DeadlineExceeded)
					}
				}
				if took := time.Since(start); took > time.Second {
					t.Errorf("readers took %v, past the 1 s cap", took)
				}
				return nil
			})
		})
	}()
	select {
	case <-finished:
	case <-time.After(20 * time.Second):
		t.Fatal("readers of fn's ctx's cause still blocked after 20 s of real time (synctest's clock stuck)")
	}
}

// causeErr is a cause type of its own, reached with errors.As.
type causeErr struct{ code int }

func (e *causeErr) Error() string { return fmt.Sprintf("cause %d", e.code) }

// TestRunCtxDeadlineCauseWrapped (held): ctx's cause is itself a wrapped
// error (fmt.Errorf %w of a *causeErr and of an errors.Join): at the
// deadline fn's ctx's cause matches it with errors.Is and errors.As, reads
// the same with %v, and is read by many goroutines at once under -race,
// before (nil) and after the deadline; a ctx that has no cause of its own
// gives DeadlineExceeded.
func TestRunCtxDeadlineCauseWrapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		inner := &causeErr{code: 7}
		sentinel := errors.New("drain")
		why := fmt.Errorf("shutdown: %w", errors.Join(inner, sentinel))
		ctx, cancel := context.WithTimeoutCause(t.Context(), time.Second, why)
		defer cancel()
		_ = fence.Run(ctx, l, "n", func(fctx context.Context, _ fence.Lease) error {
			if c := context.Cause(fctx); c != nil {
				t.Errorf("cause before the deadline: %v", c)
			}
			<-fctx.Done()
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() {
					c := context.Cause(fctx)
					var ce *causeErr
					if !errors.Is(c, sentinel) || !errors.Is(c, context.DeadlineExceeded) && !errors.Is(c, why) || !errors.As(c, &ce) || ce != inner || fmt.Sprintf("%v", c) != why.Error() {
						t.Errorf("cause %v (%T): want one matching %v, %v and *causeErr", c, c, why, sentinel)
					}
				})
			}
			wg.Wait()
			return nil
		})
		plain, pcancel := context.WithTimeout(t.Context(), time.Second)
		defer pcancel()
		_ = fence.Run(plain, l, "n", func(fctx context.Context, _ fence.Lease) error {
			<-fctx.Done()
			if c := context.Cause(fctx); !errors.Is(c, context.DeadlineExceeded) || c.Error() != context.DeadlineExceeded.Error() {
				t.Errorf("cause without one of ctx's own: %v", c)
			}
			return nil
		})
	})
}
