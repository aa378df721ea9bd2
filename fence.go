package fence

import (
	"context"
	"time"
)

// Token is a fencing token. A valid token is greater than zero; zero means
// "no token". For one lock name, every successful acquisition receives a token
// strictly greater than every token issued before it for that name. Renewing
// or extending a lease never changes its token.
type Token int64

// Locker grants leases on named locks. Implementations are safe for
// concurrent use.
//
// A nil ctx is bad input: Acquire, and every other method of this module's
// Lockers and Leases that takes a ctx, returns an error matching
// ErrInvalidOption for one, naming the method, before it does anything (no
// lock taken, nothing sent, the lease left as it was). None panics.
type Locker interface {
	// Acquire takes the lock called name. With a zero Wait budget it tries
	// once; otherwise it waits for the lock to be released or to expire, up
	// to the budget. It returns an error matching ErrNotAcquired when the
	// lock was not taken, wrapping ErrHeld, ctx.Err() or the backend's
	// error; an error matching ErrInvalidName or ErrInvalidOption when the
	// input is bad, before anything is sent to the backend. The backends
	// of this module do not return a lease whose deadline had passed when
	// the reply that took the lock came (a paused server): they give the
	// lock back and try again within the budget, or return ErrNotAcquired
	// saying the reply came too late (matching ErrLeaseLost too). A lease can still end the moment
	// after Acquire returns; Run and Lead do not start fn with one that has.
	Acquire(ctx context.Context, name string, opts ...Option) (Lease, error)
}

// Lease is a granted lock. Its methods are safe for concurrent use.
//
// A Lease ends when it is released, when the backend reports that the lock
// was removed or taken by another owner, or when it could not be renewed
// before its deadline. Then Done is closed, Context is cancelled with Err as
// its cause, and Err says why. A paused process keeps its Lease object after
// the lease has ended: pass Token to the protected resource and let it reject
// stale tokens.
type Lease interface {
	// Name returns the lock name.
	Name() string
	// Token returns the fencing token issued for this lease.
	Token() Token
	// Deadline returns the local time before which the lease is known to be
	// held. It errs early: a backend behind a network measures it from
	// before the acquire or renew request was sent, minus an allowance for
	// clock drift. A renewal that the backend ran in time but whose reply
	// came after the Deadline moves it on again, unless the lease has
	// ended meanwhile (Err, Done or Context said so, or the Observer was
	// told): an end, once seen, is final. It never blocks: Run's fn's context reads it whenever
	// asked whether it is done, maybe by the Locker itself while it holds
	// a lock of its own (keep it in an atomic, not behind such a lock).
	Deadline() time.Time
	// Done returns a channel that is closed when the lease has ended.
	Done() <-chan struct{}
	// Err returns nil while the lease is held, and afterwards why it ended:
	// ErrReleased after Release, or an error matching ErrLeaseLost.
	Err() error
	// Context returns a context that is cancelled when the lease ends, with
	// Err as its cause (see context.Cause); a Release ends the lease as it
	// starts, so its cause is then ErrReleased, even if Release finds that
	// the lease had been lost and Err says so. It carries the values of the
	// context given to Acquire but not its cancellation.
	Context() context.Context
	// Extend sets the lease to expire ttl from now and moves Deadline. It
	// returns an error matching ErrLeaseLost if the lock is no longer held
	// by this lease; on a backend error or a cancelled ctx the deadline does
	// not move. A ttl shorter than what is left moves Deadline earlier; a
	// backend may keep the lock itself held until the later time (the
	// Redis and PostgreSQL backends do: a lock's expiry there never moves
	// earlier, so that a renewal delayed on its way cannot cut it below a
	// newer Deadline).
	Extend(ctx context.Context, ttl time.Duration) error
	// Release ends the lease and deletes the lock if this lease still owns
	// it; it never deletes another owner's lock. The lease ends before the
	// delete is sent (Err, Done and Context say so at once): another owner
	// may hold the lock before Release returns. It ends so even when ctx is
	// already done: Release then returns ctx's error (or nil, from a
	// backend that sent its delete all the same). That end does not cancel
	// Release's own requests when ctx is one it cancels (Context, or the
	// context Run gives fn). It returns nil if the lock
	// was released, an error matching ErrLeaseLost if the lease had already
	// been lost, or the backend's error, in which case calling Release again
	// retries. A retry that finds the lock gone (or another's) mostly
	// cannot tell a loss from a delete of the lease's own: the call that
	// failed (its reply lost, or its client sent it again) or a delete it
	// left in the background. The backends of this module then return nil,
	// as for a release, unless they know the lock was gone before the
	// failed call (etcdlock and zklock can tell in some cases; see their
	// docs). From the first call on the lease is no longer renewed,
	// even when that call fails (a done ctx, say): a lock whose delete did
	// not get through expires at the end of its lease time. Calls after the
	// first conclusive one return the same result without contacting the
	// backend.
	Release(ctx context.Context) error
}
