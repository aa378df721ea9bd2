package memlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/atomictime"
	"github.com/fencekit/fence/internal/nilctx"
)

// lease is a lock held in a Locker. All its mutable fields are guarded by
// its Locker's mutex, so that a lease and its lock change together.
type lease struct {
	l        *Locker
	name     string
	token    fence.Token
	ttl      time.Duration // the lease time; for a watchdog lease, its TTL
	watchdog bool          // renewed by tick until released
	granted  time.Time     // for the hold time reported to the Observer

	ctx    context.Context // cancelled with err as cause when the lease ends
	cancel context.CancelCauseFunc

	// Guarded by l.mu.
	deadline time.Time
	dl       atomictime.Time // deadline's copy for Deadline, which never blocks
	timer    *time.Timer     // expires a fixed lease, renews a watchdog lease
	err      error           // why the lease ended; nil while held
	released bool            // Release reached a conclusion: relErr is its result
	relErr   error           // what Release returns once released
	// unfreed: the lease ended (err is fence.ErrReleased) by a Release
	// whose ctx was done, and its lock is still held by it, until its
	// deadline or a Release retried before then.
	unfreed bool
	// handed: given to a waiter whose goroutine has not taken it yet. Its
	// end meanwhile (its time ran out on a stalled waiter) is not
	// reported: no Acquire returned it, and none will.
	handed bool
}

var _ fence.Lease = (*lease)(nil)

func (ls *lease) Name() string             { return ls.name }
func (ls *lease) Token() fence.Token       { return ls.token }
func (ls *lease) Done() <-chan struct{}    { return ls.ctx.Done() }
func (ls *lease) Context() context.Context { return ls.ctx }
func (ls *lease) String() string           { return fmt.Sprintf("memlock lease %q token %d", ls.name, ls.token) }

func (ls *lease) Deadline() time.Time { return ls.dl.Load() }

// setDeadline sets the deadline, under its Locker's mutex, and the copy
// that Deadline reads without it.
func (ls *lease) setDeadline(d time.Time) { ls.deadline = d; ls.dl.Store(d) }

func (ls *lease) Err() error {
	ls.l.mu.Lock()
	defer ls.l.unlock()
	ls.l.expireLocked(ls, time.Now())
	return ls.err
}

// tick is the lease's timer. A fixed lease expires; a watchdog lease is
// renewed for another TTL and its timer set a third of the TTL ahead, unless
// the timer ran so late that the deadline had passed.
func (ls *lease) tick() {
	ls.l.mu.Lock()
	defer ls.l.unlock()
	now := time.Now()
	if ls.unfreed && now.Before(ls.deadline) {
		ls.timer.Reset(ls.deadline.Sub(now))
		return
	}
	if ls.unfreed {
		ls.l.freeLocked(ls)
		return
	}
	if ls.err != nil {
		return
	}
	if ls.watchdog && now.Before(ls.deadline) {
		ls.setDeadline(now.Add(ls.ttl))
		ls.timer.Reset(ls.ttl / 3)
		return
	}
	if now.Before(ls.deadline) { // extended since the timer was set
		ls.timer.Reset(ls.deadline.Sub(now))
		return
	}
	ls.l.expireLocked(ls, now)
}

// Extend sets the lease to expire ttl from now; see fence.Lease. A watchdog
// lease goes on being renewed with its watchdog TTL afterwards, the next
// time a third of that TTL from now; a ttl shorter than that ends it at
// its new deadline. After
// Release, Extend returns an error matching both fence.ErrLeaseLost and
// fence.ErrReleased. A nil ctx returns an error matching
// fence.ErrInvalidOption, the lease unchanged.
func (ls *lease) Extend(ctx context.Context, ttl time.Duration) error {
	if ctx == nil {
		return nilctx.Err("memlock", "Extend")
	}
	if err := fence.ValidateTTL(ttl); err != nil {
		return err
	}
	ls.l.mu.Lock()
	defer ls.l.unlock()
	now := time.Now()
	ls.l.expireLocked(ls, now)
	switch {
	case ls.err == fence.ErrReleased:
		return fmt.Errorf("%w: %q: %w", fence.ErrLeaseLost, ls.name, fence.ErrReleased)
	case ls.err != nil:
		return ls.err
	case ctx.Err() != nil:
		return fmt.Errorf("memlock: extend %q: %w", ls.name, ctx.Err())
	}
	ls.setDeadline(now.Add(ttl))
	if !ls.watchdog {
		ls.timer.Reset(ttl)
	} else {
		// Renewed a third of the watchdog TTL from now, as after a
		// renewal; unless the new deadline comes first: then the lease
		// ends at it, as redislock's does when its watchdog's next
		// renewal comes too late.
		ls.timer.Reset(min(ttl, ls.ttl/3))
	}
	return nil
}

// Release ends the lease and frees the lock if the lease still holds it;
// see fence.Lease. If ctx is done while the lease is held, Release does
// as the backends do when a server cannot be reached: the lease ends at
// once (Err returns fence.ErrReleased, Done is closed, Context is
// cancelled), its lock stays held by it until its deadline (a watchdog
// lease is renewed no more), and Release returns ctx's error. Calling
// Release again retries: before the deadline it frees the lock and
// returns nil; after it, it returns an error matching fence.ErrLeaseLost
// (as redislock's retry that finds the lock gone). A ctx cancelled by a
// lease's release (the lease's Context, fence.Run's fn's context) is not
// done for Release: it can retry with it. A nil ctx returns an error
// matching fence.ErrInvalidOption, the lease unchanged.
func (ls *lease) Release(ctx context.Context) error {
	if ctx == nil {
		return nilctx.Err("memlock", "Release")
	}
	ls.l.mu.Lock()
	defer ls.l.unlock()
	if ls.released {
		return ls.relErr
	}
	ls.l.expireLocked(ls, time.Now())
	switch {
	case ls.err == nil || ls.unfreed:
		if err := ctx.Err(); err != nil && (errors.Is(err, context.DeadlineExceeded) || !errors.Is(context.Cause(ctx), fence.ErrReleased)) {
			if ls.err == nil {
				ls.l.endUnfreedLocked(ls)
			}
			return fmt.Errorf("memlock: release %q: %w", ls.name, err)
		}
		if ls.unfreed {
			ls.l.freeLocked(ls)
		} else {
			ls.l.endLocked(ls, fence.ErrReleased)
		}
		ls.relErr = nil
	case ls.err == fence.ErrReleased:
		// A Release that failed ended it; its lock has expired or was
		// removed since.
		ls.relErr = fmt.Errorf("%w: %q expired or was removed after a Release that failed", fence.ErrLeaseLost, ls.name)
	default:
		ls.relErr = ls.err
	}
	ls.released = true
	return ls.relErr
}
