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
// it; fn's context ends at the same moment, but with DeadlineExceeded as
// its cause: fn cannot tell why it was stopped.
func TestRunCtxDeadlineKeepsCtxCause(t *testing.T) {
	t.Skip("design question: fn's context takes ctx's deadline with a timer of its own (context.WithDeadline on the lease's context, so that the lease's end cancels it synchronously), and a context's deadline cause is not readable before it fires; " +
		"the AfterFunc on ctx that could pass Cause(ctx) races that timer. The fix I would choose: when ctx's cause at its end is not DeadlineExceeded, have the AfterFunc cancel fn's context with it and give fn's deadline timer a cause that unwraps to Cause(ctx) at fire time; it changes what Cause(fn's ctx) == context.DeadlineExceeded compares, so it needs a decision")
	synctest.Test(t, func(t *testing.T) {
		l := newMemlock(t)
		why := errors.New("shutdown: drain deadline")
		ctx, cancel := context.WithTimeoutCause(t.Context(), time.Minute, why)
		defer cancel()
		_ = fence.Run(ctx, l, "n", func(fctx context.Context, _ fence.Lease) error {
			<-fctx.Done()
			if !errors.Is(fctx.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(fctx), why) {
				t.Errorf("at ctx's deadline fn's ctx Err %v, cause %v; want DeadlineExceeded and ctx's cause %v", fctx.Err(), context.Cause(fctx), why)
			}
			return nil
		})
	})
}
