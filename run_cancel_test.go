package fence_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
)

// Once the lease has ended (its Done closed, and with memlock the lock
// already granted to the next waiter), fn's context is done: a fn that
// checks ctx.Err() before each write must not find it nil then. fn's
// context was cancelled by a context.AfterFunc on the lease's Context,
// which runs in a goroutine of its own: for a moment after the lease
// ended, and after the next leader had started, fn's ctx still said go.
func TestRunCtxDoneOnceLeaseEnded(t *testing.T) {
	l := newMemlock(t)
	late := 0
	const runs = 200
	for range runs {
		err := fence.Run(t.Context(), l, "n", func(ctx context.Context, lease fence.Lease) error {
			l.Remove("n")
			<-lease.Done()
			if ctx.Err() == nil {
				late++
			}
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), fence.ErrLeaseLost) {
				t.Errorf("fn's ctx cause %v, want ErrLeaseLost", context.Cause(ctx))
			}
			return nil
		})
		if !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Run = %v, want ErrLeaseLost", err)
		}
	}
	if late > 0 {
		t.Fatalf("in %d of %d runs fn's ctx was not done after the lease's Done was closed", late, runs)
	}
}

// Two candidates on memlock: when the leader's lock is removed, the other,
// waiting, is granted it at once. When the new leader's fn starts, the old
// leader's fn must already see its context done (memlock ends the old
// lease before it grants the new one): only then does a fn that checks
// ctx.Err() before each write never write while another leads.
func TestLeadOldLeaderCtxDoneBeforeNewLeaderStarts(t *testing.T) {
	l := newMemlock(t)
	ctx, cancel := context.WithCancel(t.Context())
	var mu sync.Mutex
	var current context.Context // the leading fn's ctx
	overlaps, terms := 0, 0
	elected := make(chan struct{}, 1)
	fn := func(fctx context.Context, lease fence.Lease) error {
		mu.Lock()
		if current != nil && current.Err() == nil {
			overlaps++
		}
		current = fctx
		terms++
		mu.Unlock()
		elected <- struct{}{}
		<-fctx.Done()
		return nil
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			_ = fence.Lead(ctx, l, "leader", fn, fence.Backoff(time.Millisecond, time.Millisecond), fence.LeaseOptions(fence.Wait(time.Minute)))
		})
	}
	const handovers = 100
	<-elected
	for range handovers {
		l.Remove("leader")
		<-elected
	}
	cancel()
	wg.Wait()
	if overlaps > 0 {
		t.Fatalf("in %d of %d terms the new leader's fn started while the old one's ctx was not done", overlaps, terms)
	}
}

type ctxKey struct{}

// fn's context is still what a child of ctx would be: ctx's values and
// deadline, context.DeadlineExceeded when that passes, ctx's cause when it
// is cancelled, the lease's Err as the cause when the lease ends.
func TestRunCtxLikeChildOfCtx(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		base := context.WithValue(t.Context(), ctxKey{}, "v")

		ctx, cancel := context.WithTimeout(base, time.Minute)
		defer cancel()
		want, _ := ctx.Deadline()
		_ = fence.Run(ctx, l, "n", func(fctx context.Context, _ fence.Lease) error {
			if v := fctx.Value(ctxKey{}); v != "v" {
				t.Errorf("fn's ctx value %v, want ctx's", v)
			}
			if d, ok := fctx.Deadline(); !ok || !d.Equal(want) {
				t.Errorf("fn's ctx deadline %v %v, want ctx's %v", d, ok, want)
			}
			<-fctx.Done()
			// The cause is ctx's, read once ctx ended (see
			// TestRunCtxDeadlineKeepsCtxCause): it matches, and reads as,
			// DeadlineExceeded, but is not that value itself.
			if fctx.Err() != context.DeadlineExceeded || !errors.Is(context.Cause(fctx), context.DeadlineExceeded) || context.Cause(fctx).Error() != context.DeadlineExceeded.Error() {
				t.Errorf("at ctx's deadline fn's ctx Err %v cause %v, want DeadlineExceeded", fctx.Err(), context.Cause(fctx))
			}
			return nil
		})

		why := errors.New("shutdown")
		cctx, ccancel := context.WithCancelCause(base)
		_ = fence.Run(cctx, l, "n", func(fctx context.Context, _ fence.Lease) error {
			if _, ok := fctx.Deadline(); ok {
				t.Error("fn's ctx has a deadline, ctx none")
			}
			ccancel(why)
			<-fctx.Done()
			if fctx.Err() != context.Canceled || context.Cause(fctx) != why {
				t.Errorf("fn's ctx Err %v cause %v, want Canceled and ctx's cause", fctx.Err(), context.Cause(fctx))
			}
			return nil
		})

		_ = fence.Run(base, l, "n", func(fctx context.Context, lease fence.Lease) error {
			l.Remove("n")
			if fctx.Err() == nil || !errors.Is(context.Cause(fctx), fence.ErrLeaseLost) {
				t.Errorf("fn's ctx Err %v cause %v once the lease was lost, want its Err", fctx.Err(), context.Cause(fctx))
			}
			return nil
		}, fence.TTL(time.Hour))
	})
}
