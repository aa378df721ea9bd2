package fence_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// cancelOnAcquired cancels a ctx as an acquisition is reported: between
// the grant and fn's start.
type cancelOnAcquired struct {
	fence.NopObserver
	cancel context.CancelFunc
}

func (c cancelOnAcquired) AcquireDone(ev fence.AcquireEvent) {
	if ev.Result == fence.Acquired {
		c.cancel()
	}
}

// Run with its ctx cancelled at each point: before Acquire, while Acquire
// waits, between the grant and fn's start, while fn runs. Whichever, Run
// returns, fn (if it ran) saw its ctx done, and the lock is free at once
// afterwards (a holder that was waited for, once it releases).
func TestRunCtxCancelledAtEachPoint(t *testing.T) {
	for _, at := range []string{"before", "waiting", "granted", "fn"} {
		t.Run(at, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				var opts *memlock.Options
				if at == "granted" {
					opts = &memlock.Options{Observer: cancelOnAcquired{cancel: cancel}}
				}
				l, err := memlock.New(opts)
				if err != nil {
					t.Fatal(err)
				}
				var holder fence.Lease
				switch at {
				case "before":
					cancel()
				case "waiting":
					if holder, err = l.Acquire(t.Context(), "n"); err != nil {
						t.Fatal(err)
					}
					time.AfterFunc(time.Second, cancel)
				}
				ran := false
				err = fence.Run(ctx, l, "n", func(fctx context.Context, _ fence.Lease) error {
					ran = true
					if at == "fn" {
						cancel()
					}
					<-fctx.Done()
					if !errors.Is(context.Cause(fctx), context.Canceled) {
						t.Errorf("fn's ctx cause %v, want ctx's", context.Cause(fctx))
					}
					return context.Cause(fctx)
				}, fence.Wait(time.Hour))
				if !errors.Is(err, context.Canceled) {
					t.Errorf("Run = %v, want context.Canceled", err)
				}
				if ran != (at == "granted" || at == "fn") {
					t.Errorf("fn ran: %v", ran)
				}
				if holder != nil {
					if err := holder.Release(t.Context()); err != nil {
						t.Fatal(err)
					}
				}
				lease, err := l.Acquire(t.Context(), "n")
				if err != nil {
					t.Fatalf("the lock is not free after Run returned: %v", err)
				}
				_ = lease.Release(t.Context())
			})
		})
	}
}
