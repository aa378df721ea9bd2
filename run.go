package fence

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/fencekit/fence/internal/pause"
)

// errEndedOnArrival is in Run's error when Acquire returned a lease that had
// already ended; Lead treats it as a lost lease.
var errEndedOnArrival = errors.New("fence: the lease ended before Acquire returned")

// releaseTimeout bounds the Release that Run makes after fn returns, which
// runs even when ctx is already cancelled.
const releaseTimeout = 5 * time.Second

// Run acquires the lock called name, calls fn with the lease, and releases
// the lease when fn returns, however it returns.
//
// fn's context is cancelled when ctx is done or the lease ends, whichever is
// first: by the lease's end at once (it is done, to every goroutine, by
// the time the lease's Done is closed, before the lock can go to another
// owner through this process; a context fn derives from it follows a
// moment later), by ctx's end a moment later (from a goroutine; ctx's deadline,
// which fn's context has too, at once). It is done too, to a goroutine that
// asks it (Err, Done, Value), once the lease's Deadline has passed, though
// the Locker's timer that ends the lease may fire later on a loaded
// machine; its cause then matches ErrLeaseLost. It has ctx's values. Its Err is
// what a child of ctx's would say: context.DeadlineExceeded at ctx's
// deadline, context.Canceled otherwise. Its cause (context.Cause) is the
// lease's Err when the lease ends first (matching ErrLeaseLost, or
// ErrReleased), and ctx's cause when ctx ends first: the one given to
// context.WithCancelCause, WithDeadlineCause or WithTimeoutCause, or ctx's
// Err. A cancelled ctx's cause is passed as it is; at ctx's deadline the
// cause is an error that wraps ctx's (read once ctx has ended) and says the
// same, so compare it with errors.Is, not ==. fn must stop
// writing when it is, and pass lease.Token() with every
// write so that the resource can reject it if it comes late anyway. Run
// returns the error from Acquire if the lock was not taken (fn is not
// called; a Locker that returns neither a lease nor an error gets one
// matching ErrNotAcquired, and a lease returned with an error is
// released). fn is not called either with a lease that had already ended
// when Acquire returned it (its Err set: a backend whose reply came after
// the lease's deadline): Run releases it and returns an error matching
// ErrNotAcquired that wraps the lease's Err (so ErrLeaseLost too), joined
// with Release's error unless that matches ErrLeaseLost. Otherwise fn's error joined with Release's error, so a lease
// that was lost while fn ran shows up as an error matching ErrLeaseLost even when
// fn returned nil; so does one whose Deadline ended fn's context, though the
// Locker had not noticed and Release found the lock still the lease's. A nil locker or fn is an error matching
// ErrInvalidOption.
//
// A Release that fails without a conclusion (a backend error, but not one
// matching ErrClosed: the Locker's client was closed) is retried for up
// to 5 s, and no longer than ctx's deadline if ctx has one (the first try
// is made even after it: the lock then expires at the lease's deadline); if the first try did free the lock and only its reply was
// lost, the retry may report ErrLeaseLost (a backend that cannot tell its
// own late delete from another owner's doing; redlock's retry counts a late
// delete of its first call as done and returns nil). If fn panics, the lease is released
// and the panic goes on up through Run.
func Run(ctx context.Context, locker Locker, name string, fn func(ctx context.Context, lease Lease) error, opts ...Option) error {
	return run(ctx, locker, name, fn, nil, opts...)
}

// run is Run; when fn was called, it also sets *released, if given, to
// Release's part of its error: Lead tells a Release that says the Locker
// was closed from fn's own error saying so of another.
func run(ctx context.Context, locker Locker, name string, fn func(ctx context.Context, lease Lease) error, released *error, opts ...Option) (err error) {
	if locker == nil || fn == nil {
		return fmt.Errorf("%w: Run with a nil Locker or fn", ErrInvalidOption)
	}
	if ctx == nil {
		return fmt.Errorf("%w: Run with a nil context", ErrInvalidOption)
	}
	lease, err := locker.Acquire(ctx, name, opts...)
	switch {
	case err != nil && !holdsNil(lease):
		// Against the contract; but dropping the lease would leave its
		// lock held (by a watchdog: for ever), with nobody to release it.
		return errors.Join(err, releaseRetrying(ctx, lease))
	case err != nil:
		return err
	case holdsNil(lease):
		return NotAcquired(name, fmt.Errorf("fence: %T.Acquire returned neither a lease nor an error", locker))
	}
	if lerr := lease.Err(); lerr != nil {
		// Ended before fn could begin (redislock's reply came after the
		// lease's deadline, say): fn would start with its context done.
		// Release it as after fn; a Release that finds it lost says
		// what lerr says.
		ended := NotAcquired(name, fmt.Errorf("%w: %w", errEndedOnArrival, lerr))
		if relErr := releaseRetrying(ctx, lease); relErr != nil && !errors.Is(relErr, ErrLeaseLost) {
			return errors.Join(ended, relErr)
		}
		return ended
	}
	workCtx, end := workContext(ctx, lease)
	var fnErr error
	// Deferred, so that a panic in fn (or runtime.Goexit) releases the
	// lease too: a caller that recovers must not be left with a lock that
	// a watchdog renews for ever.
	defer func() {
		end()
		relErr := releaseRetrying(ctx, lease)
		if past := workCtx.pastDeadline.Load(); past != nil && !errors.Is(relErr, ErrLeaseLost) {
			// fn's context ended at the lease's Deadline, before the
			// Locker noticed (its timer late; a backend whose Err reads
			// only that timer then releases the lock as its own): the
			// lease was not known to be held while fn ran, as when the
			// Locker ends it then.
			relErr = errors.Join(relErr, *past)
		}
		if released != nil {
			*released = relErr
		}
		err = errors.Join(fnErr, relErr)
	}()
	fnErr = fn(workCtx, lease)
	return nil
}

// releaseRetrying releases lease for Run, with a context that outlives a
// cancelled ctx (a lock left held blocks others until it expires), for up
// to releaseTimeout. An inconclusive failure (the statement went out on a
// connection that a server restart had killed) is retried: the caller has
// no lease to retry with, and the lock would stay held until it expires.
// The retries stop at ctx's deadline, if it has one: a backend that is down
// costs the caller no more than its deadline and the first try (the lock
// then expires at the lease's deadline). The first try is made even past
// it: a ctx that fn's own work ended must not keep the lock held.
func releaseRetrying(ctx context.Context, lease Lease) error {
	relCtx, relCancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer relCancel()
	relErr := lease.Release(relCtx)
	retryCtx := relCtx
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		retryCtx, cancel = context.WithDeadline(relCtx, deadline)
		defer cancel()
	}
	return pause.Retry(retryCtx, relErr, func() error { return lease.Release(retryCtx) }, releaseConcluded)
}

// releaseConcluded reports whether err, the error of a Release, says how
// the release ended (the lease was lost, or its Locker closed), so that
// retrying it would tell nothing more; any other error is inconclusive.
func releaseConcluded(err error) bool {
	return errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrClosed)
}

// workContext returns fn's context, done when ctx is or the lease ends,
// with the values of ctx and its deadline, and the func that ends it once
// fn has returned. It is a child of the lease's Context, not of ctx, so
// that the lease's end cancels it at once, in the call that ends the lease
// (where that Context is one of the context package's, as every backend's
// is): before another owner can be granted the lock by that call. An
// AfterFunc on the lease's Context cancelled it in a goroutine of its own,
// a moment later. The lease's Context carries the values of the ctx given
// to Acquire, which is ctx. ctx's end cancels it from an AfterFunc, with
// ctx's cause; when ctx's deadline passes, the same deadline of fn's
// context ends it with context.DeadlineExceeded, as a child of ctx would
// have been, and with a cause that is ctx's (see ctxDeadlineCause). Being
// a child is not enough for a goroutine other than the one that ends the
// lease: see workCtx.
func workContext(ctx context.Context, lease Lease) (*workCtx, func()) {
	work, cancel := context.WithCancelCause(lease.Context())
	cancelDeadline := func() {}
	deadline, hasDeadline := ctx.Deadline()
	ret := work
	if hasDeadline {
		ret, cancelDeadline = context.WithDeadlineCause(work, deadline, &ctxDeadlineCause{ctx: ctx})
	}
	stop := context.AfterFunc(ctx, func() {
		if hasDeadline && errors.Is(ctx.Err(), context.DeadlineExceeded) && !time.Now().Before(deadline) {
			return // ret's own deadline, the same, ends it
		}
		cancel(context.Cause(ctx))
	})
	return &workCtx{Context: ret, lease: lease.Context(), of: lease, cancel: cancel}, func() {
		stop()
		cancelDeadline()
		cancel(nil)
	}
}

// workCtx is fn's context: ret of workContext, which also looks at the
// lease before it answers. The context package cancels a context's
// children after it has closed the context's Done channel and released
// the goroutines that wait on it: for a moment after the lease ended, a
// goroutine that saw its Done closed (or a timer's, a watch's goroutine
// that ended it) could find fn's context not done yet
// (TestRunCtxDoneWithLease, in every backend: up to 13 runs in 50). And a
// Locker's timer that ends the lease at its Deadline can fire late on a
// loaded machine (a GC pause, a descheduled process), while the server's
// expiry is only moments after that Deadline (1% plus 2 ms on Redis):
// another owner's work could start while fn's context still said go. Err,
// Done and Value (and so context.Cause) first cancel fn's context, with
// the lease's cause if the lease's Context has ended, or with an error
// matching ErrLeaseLost once the lease's Deadline has passed (Deadline
// never blocks: see Lease).
type workCtx struct {
	context.Context                         // ret: a child of work
	lease           context.Context         // the lease's Context, work's parent
	of              Lease                   // for its Deadline
	cancel          context.CancelCauseFunc // work's
	// pastDeadline is the cause sync ended work with at the lease's
	// Deadline, if it did (nil otherwise), for Run's error.
	pastDeadline atomic.Pointer[error]
}

// sync cancels work if the lease's Context has ended, or its Deadline has
// passed, and fn's context has not: the propagation from the lease's
// Context may not have reached it, and the Locker's timer may not have
// fired yet.
func (c *workCtx) sync() {
	if c.Context.Err() != nil {
		return
	}
	if c.lease.Err() != nil {
		c.cancel(context.Cause(c.lease))
		return
	}
	if d := c.of.Deadline(); !d.IsZero() && !time.Now().Before(d) {
		err := fmt.Errorf("%w: %q: its deadline %v has passed", ErrLeaseLost, c.of.Name(), d.Round(0).Format(time.RFC3339Nano))
		c.cancel(err)
		if context.Cause(c.Context) == err { // this call ended it
			c.pastDeadline.CompareAndSwap(nil, &err)
		}
	}
}

func (c *workCtx) Done() <-chan struct{} { c.sync(); return c.Context.Done() }
func (c *workCtx) Err() error            { c.sync(); return c.Context.Err() }
func (c *workCtx) Value(key any) any     { c.sync(); return c.Context.Value(key) }

// causeWait bounds how long ctxDeadlineCause waits for a ctx whose
// deadline has passed to end.
const causeWait = time.Second

// ctxDeadlineCause is the cause of fn's context when ctx's deadline, which
// fn's context has too, passes: ctx's own cause then
// (context.DeadlineExceeded, or the cause given to
// context.WithDeadlineCause or WithTimeoutCause), as a child of ctx would
// have. The cause of a context's deadline cannot be read before the
// deadline fires, and fn's context's timer fires at the same moment as
// ctx's, maybe first: so the cause is read when it is first asked for,
// once ctx has ended. A context of the context package whose deadline has
// passed ends at once; one that does not within causeWait (a Context of
// its own that reports a deadline it does not keep) gives
// context.DeadlineExceeded.
type ctxDeadlineCause struct {
	ctx context.Context
	err atomic.Pointer[error] // the first reader's answer, then everyone's
}

// cause waits for ctx's end (at most causeWait) and returns its cause,
// the first reader's answer for every reader. Readers wait on channels
// only, not on each other (a sync.Once here made the others wait on its
// mutex, which a synctest bubble does not count as blocked, so that its
// clock stood still and the waiting reader's timer never fired:
// TestRunCtxDeadlineCauseReadersInBubble).
func (c *ctxDeadlineCause) cause() error {
	if p := c.err.Load(); p != nil {
		return *p
	}
	if c.ctx.Err() == nil {
		t := time.NewTimer(causeWait)
		select {
		case <-c.ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	err := context.Cause(c.ctx)
	if err == nil {
		err = context.DeadlineExceeded
	}
	c.err.CompareAndSwap(nil, &err)
	return *c.err.Load()
}

func (c *ctxDeadlineCause) Error() string { return c.cause().Error() }

// Unwrap returns ctx's cause, so that errors.Is and errors.As see it.
func (c *ctxDeadlineCause) Unwrap() error { return c.cause() }
