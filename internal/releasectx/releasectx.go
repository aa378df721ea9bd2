// Package releasectx makes the context that a lease's Release sends its
// requests under: a Release ends the lease before the request that frees
// the lock leaves, and that end must not cancel the request.
package releasectx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencekit/fence"
)

// Detach returns ctx for Release's requests, except that it is not
// cancelled when ctx is cancelled by a lease's end as released (with a
// cause matching fence.ErrReleased): the lease's own Context, one derived
// from it, or the context fence.Run gives fn, which the lease's end
// cancels. Release ends its lease as it starts, so such a ctx would
// otherwise cut short the very request that frees the lock, and leave the
// lock held, by nobody, until it expires. It ends at bound instead (not
// zero: the lease's deadline, at which its expiry used to cancel such a
// ctx), so that a Release on a hung server still returns. Its values and
// deadline are ctx's, and any other cancellation of ctx cancels it. A ctx
// that cannot end, or has ended already otherwise than as released, is
// returned as it is; one already released (a Release called again after
// one that failed, with the lease's Context) is detached all the same, or
// the retry would end before it sent anything. stop must be called once
// Release is done with it.
func Detach(ctx context.Context, bound time.Time) (_ context.Context, stop func()) {
	return DetachBy(ctx, func() time.Time { return bound })
}

// DetachBy is Detach with the bound read when ctx is cancelled as
// released, not when Release starts: a renewal that Release waited for
// (a watchdog's in flight) may have moved the lease's deadline meanwhile,
// and the deadline read before it may have passed by the time Release
// ends the lease and sends its request. bound must not block (a lease's
// Deadline).
func DetachBy(ctx context.Context, bound func() time.Time) (_ context.Context, stop func()) {
	if ctx.Done() == nil {
		return ctx, func() {}
	}
	if err := ctx.Err(); err != nil && (errors.Is(err, context.DeadlineExceeded) || !errors.Is(context.Cause(ctx), fence.ErrReleased)) {
		return ctx, func() {}
	}
	dl, hasDeadline := ctx.Deadline()
	d, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	var (
		mu      sync.Mutex
		stopped bool
		timer   *time.Timer // ends d at bound, once ctx was released
	)
	stopAfter := context.AfterFunc(ctx, func() {
		if hasDeadline && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return // the deadline below ends it, as it ended ctx
		}
		cause := context.Cause(ctx)
		if !errors.Is(cause, fence.ErrReleased) {
			cancel(cause)
			return
		}
		b := bound()
		if b.IsZero() {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			timer = time.AfterFunc(time.Until(b), func() { cancel(errPastDeadline) })
		}
	})
	out, cancelDeadline := context.Context(d), context.CancelFunc(func() {})
	if hasDeadline {
		out, cancelDeadline = context.WithDeadline(d, dl)
	}
	return out, func() {
		stopAfter()
		mu.Lock()
		stopped = true
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancelDeadline()
		cancel(nil)
	}
}

// errPastDeadline is the cause of a detached context that ended at its
// bound.
var errPastDeadline = fmt.Errorf("%w: the lease's deadline passed while it was released", context.DeadlineExceeded)
