package fence_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// Lead's doc: fn's context is cancelled "when ctx ends (ctx's cause)".
// A ctx made with context.WithTimeoutCause (a shutdown deadline with its
// reason) ends at its deadline with that cause, and so does any child of
// it; fn's context ended at the same moment, but with DeadlineExceeded as
// its cause: fn could not tell why it was stopped.
func TestRunCtxDeadlineKeepsCtxCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		why := errors.New("shutdown: drain deadline")
		ctx, cancel := context.WithTimeoutCause(t.Context(), time.Minute, why)
		defer cancel()
		_ = fence.Run(ctx, l, "n", func(fctx context.Context, _ fence.Lease) error {
			child, cancelChild := context.WithCancel(fctx)
			defer cancelChild()
			<-fctx.Done()
			if !errors.Is(fctx.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(fctx), why) {
				t.Errorf("at ctx's deadline fn's ctx Err %v, cause %v; want DeadlineExceeded and ctx's cause %v", fctx.Err(), context.Cause(fctx), why)
			}
			if got := context.Cause(fctx).Error(); got != why.Error() {
				t.Errorf("fn's ctx cause reads %q, want ctx's %q", got, why)
			}
			if !errors.Is(child.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(child), why) {
				t.Errorf("a child of fn's ctx: Err %v, cause %v; want DeadlineExceeded and ctx's cause", child.Err(), context.Cause(child))
			}
			return nil
		})

		// The same with context.WithDeadlineCause.
		at := time.Now().Add(time.Minute)
		dctx, dcancel := context.WithDeadlineCause(t.Context(), at, why)
		defer dcancel()
		_ = fence.Run(dctx, l, "n", func(fctx context.Context, _ fence.Lease) error {
			if d, ok := fctx.Deadline(); !ok || !d.Equal(at) {
				t.Errorf("fn's ctx deadline %v %v, want ctx's %v", d, ok, at)
			}
			<-fctx.Done()
			if !errors.Is(fctx.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(fctx), why) {
				t.Errorf("WithDeadlineCause: fn's ctx Err %v, cause %v; want DeadlineExceeded and %v", fctx.Err(), context.Cause(fctx), why)
			}
			return nil
		})
	})
}

// ctx made with context.WithCancelCause, with or without a deadline, and
// cancelled with a cause: fn's ctx says Canceled, with that very cause.
func TestRunCtxCancelCauseKeepsCtxCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		why := errors.New("shutdown: SIGTERM")
		for _, withDeadline := range []bool{false, true} {
			ctx, cancel := context.WithCancelCause(t.Context())
			var run context.Context = ctx
			if withDeadline {
				var c context.CancelFunc
				run, c = context.WithTimeoutCause(ctx, time.Hour, errors.New("the deadline's cause"))
				defer c()
			}
			_ = fence.Run(run, l, "n", func(fctx context.Context, _ fence.Lease) error {
				cancel(why)
				<-fctx.Done()
				if fctx.Err() != context.Canceled || context.Cause(fctx) != why {
					t.Errorf("deadline %v: fn's ctx Err %v, cause %v; want Canceled and %v", withDeadline, fctx.Err(), context.Cause(fctx), why)
				}
				return nil
			})
		}
	})
}

// When the lease ends before ctx's deadline, fn's ctx's cause is the
// lease's end (ErrLeaseLost), not ctx's deadline cause.
func TestRunCtxDeadlineCauseLeaseEndsFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		why := errors.New("shutdown: drain deadline")
		ctx, cancel := context.WithTimeoutCause(t.Context(), time.Minute, why)
		defer cancel()
		_ = fence.Run(ctx, l, "n", func(fctx context.Context, _ fence.Lease) error {
			<-fctx.Done()
			if !errors.Is(context.Cause(fctx), fence.ErrLeaseLost) || errors.Is(context.Cause(fctx), why) {
				t.Errorf("the lease expired first: fn's ctx cause %v, want ErrLeaseLost", context.Cause(fctx))
			}
			return nil
		}, fence.TTL(time.Second))
	})
}

// lateCtx reports a deadline and ends a little after it, with its own
// cause: fn's ctx's timer fires first, and its cause must still be ctx's
// once ctx ends, not DeadlineExceeded read too soon. neverCtx reports a
// deadline and never ends: fn's ctx's cause is DeadlineExceeded, and
// reading it does not hang.
type lateCtx struct {
	context.Context
	deadline time.Time
}

func (c lateCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func TestRunCtxDeadlineCauseReadOnceCtxEnded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		why := errors.New("shutdown: drain deadline")
		at := time.Now().Add(time.Minute)
		inner, cancel := context.WithDeadlineCause(t.Context(), at.Add(10*time.Millisecond), why)
		defer cancel()
		_ = fence.Run(lateCtx{inner, at}, l, "n", func(fctx context.Context, _ fence.Lease) error {
			<-fctx.Done()
			if !errors.Is(fctx.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(fctx), why) {
				t.Errorf("ctx ended after fn's ctx's timer: fn's ctx Err %v, cause %v; want DeadlineExceeded and %v", fctx.Err(), context.Cause(fctx), why)
			}
			return nil
		})

		never := lateCtx{context.WithoutCancel(t.Context()), time.Now().Add(time.Minute)}
		_ = fence.Run(never, l, "n", func(fctx context.Context, _ fence.Lease) error {
			<-fctx.Done()
			start := time.Now()
			if cause := context.Cause(fctx); !errors.Is(cause, context.DeadlineExceeded) {
				t.Errorf("ctx reports a deadline it never keeps: fn's ctx cause %v, want DeadlineExceeded", cause)
			}
			if waited := time.Since(start); waited > 5*time.Second {
				t.Errorf("reading the cause took %v", waited)
			}
			return nil
		})
	})
}

// Lead hands fn its context through Run: the same cause at ctx's deadline,
// and Lead returns it.
func TestLeadCtxDeadlineKeepsCtxCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		why := errors.New("shutdown: drain deadline")
		ctx, cancel := context.WithTimeoutCause(t.Context(), time.Minute, why)
		defer cancel()
		var seen error
		err := fence.Lead(ctx, l, "leader", func(fctx context.Context, _ fence.Lease) error {
			<-fctx.Done()
			seen = context.Cause(fctx)
			return seen
		})
		if !errors.Is(seen, why) || !errors.Is(err, why) {
			t.Errorf("fn's ctx cause %v, Lead = %v; want ctx's cause %v", seen, err, why)
		}
	})
}

// In real time, fn's ctx's deadline timer and ctx's fire in either order:
// the cause fn reads is ctx's every time.
func TestRunCtxDeadlineCauseRealTimers(t *testing.T) {
	l := newMemlock(t)
	why := errors.New("shutdown: drain deadline")
	for i := range 200 {
		ctx, cancel := context.WithTimeoutCause(context.Background(), time.Millisecond, why)
		err := fence.Run(ctx, l, "n", func(fctx context.Context, _ fence.Lease) error {
			<-fctx.Done()
			if !errors.Is(fctx.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(fctx), why) {
				t.Errorf("run %d: fn's ctx Err %v, cause %v; want DeadlineExceeded and %v", i, fctx.Err(), context.Cause(fctx), why)
			}
			return nil
		})
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("run %d: %v", i, err)
		}
		if t.Failed() {
			return
		}
	}
}
