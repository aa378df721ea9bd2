package memlock

import (
	"context"
	"fmt"
	"time"

	"github.com/fencekit/fence"
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
	timer    *time.Timer // expires a fixed lease, renews a watchdog lease
	err      error       // why the lease ended; nil while held
	released bool        // Release reached a conclusion: err is its result
}

var _ fence.Lease = (*lease)(nil)

func (ls *lease) Name() string             { return ls.name }
func (ls *lease) Token() fence.Token       { return ls.token }
func (ls *lease) Done() <-chan struct{}    { return ls.ctx.Done() }
func (ls *lease) Context() context.Context { return ls.ctx }
func (ls *lease) String() string           { return fmt.Sprintf("memlock lease %q token %d", ls.name, ls.token) }

func (ls *lease) Deadline() time.Time {
	ls.l.mu.Lock()
	defer ls.l.unlock()
	return ls.deadline
}

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
	if ls.err != nil {
		return
	}
	now := time.Now()
	if ls.watchdog && now.Before(ls.deadline) {
		ls.deadline = now.Add(ls.ttl)
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
// fence.ErrReleased.
func (ls *lease) Extend(ctx context.Context, ttl time.Duration) error {
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
	ls.deadline = now.Add(ttl)
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
// see fence.Lease. If ctx is already done while the lease is held, Release
// leaves the lock held and returns ctx's error, as a backend that could not
// be reached would; calling Release again retries. A watchdog lease is no
// longer renewed then, so that the lock expires at its deadline rather than
// stay held for ever for an owner that gave it up.
func (ls *lease) Release(ctx context.Context) error {
	ls.l.mu.Lock()
	defer ls.l.unlock()
	if ls.released {
		if ls.err == fence.ErrReleased {
			return nil
		}
		return ls.err
	}
	ls.l.expireLocked(ls, time.Now())
	if ls.err == nil {
		if err := ctx.Err(); err != nil {
			ls.watchdog = false // tick expires it at its deadline
			return fmt.Errorf("memlock: release %q: %w", ls.name, err)
		}
		ls.l.endLocked(ls, fence.ErrReleased)
	}
	ls.released = true
	if ls.err == fence.ErrReleased {
		return nil
	}
	return ls.err
}
