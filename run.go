package fence

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// releaseTimeout bounds the Release that Run makes after fn returns, which
// runs even when ctx is already cancelled.
const releaseTimeout = 5 * time.Second

// Run acquires the lock called name, calls fn with the lease, and releases
// the lease when fn returns, however it returns.
//
// fn's context is cancelled when ctx is done or the lease ends, whichever is
// first; fn must stop writing when it is, and pass lease.Token() with every
// write so that the resource can reject it if it comes late anyway. Run
// returns the error from Acquire if the lock was not taken (fn is not
// called); otherwise fn's error joined with Release's error, so a lease that
// was lost while fn ran shows up as an error matching ErrLeaseLost even when
// fn returned nil. A nil locker or fn is an error matching
// ErrInvalidOption.
//
// A Release that fails without a conclusion (a backend error, but not one
// matching ErrClosed: the Locker's client was closed) is retried for up
// to 5 s; if the first try did free the lock and only its reply was
// lost, the retry may report ErrLeaseLost (a backend that cannot tell its
// own late delete from another owner's doing; redlock's retry counts a late
// delete of its first call as done and returns nil). If fn panics, the lease is released
// and the panic goes on up through Run.
func Run(ctx context.Context, locker Locker, name string, fn func(ctx context.Context, lease Lease) error, opts ...Option) (err error) {
	if locker == nil || fn == nil {
		return fmt.Errorf("%w: Run with a nil Locker or fn", ErrInvalidOption)
	}
	lease, err := locker.Acquire(ctx, name, opts...)
	if err != nil {
		return err
	}
	workCtx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lease.Context(), func() { cancel(lease.Err()) })
	var fnErr error
	// Deferred, so that a panic in fn (or runtime.Goexit) releases the
	// lease too: a caller that recovers must not be left with a lock that
	// a watchdog renews for ever.
	defer func() {
		stop()
		cancel(nil)
		// Release with a context that outlives a cancelled ctx: a lock left
		// held blocks others until it expires.
		relCtx, relCancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer relCancel()
		// An inconclusive failure (the statement went out on a connection
		// that a server restart had killed) is retried: the caller has no
		// lease to retry with, and the lock would stay held until it expires.
		relErr := lease.Release(relCtx)
		for pause := 10 * time.Millisecond; relErr != nil && !errors.Is(relErr, ErrLeaseLost) && !errors.Is(relErr, ErrClosed) && sleep(relCtx, pause); pause = min(2*pause, time.Second) {
			relErr = lease.Release(relCtx)
		}
		err = errors.Join(fnErr, relErr)
	}()
	fnErr = fn(workCtx, lease)
	return nil
}
