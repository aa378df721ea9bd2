package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencekit/fence"
	"github.com/redis/go-redis/v9"
)

// lease is a lock held on a majority of the nodes. Its expiry timer ends it
// at the local deadline unless a renewal moved the deadline first; a
// watchdog lease has a goroutine that renews it every third of its TTL.
type lease struct {
	locker *Locker
	name   string
	keys   keys
	owner  string
	token  fence.Token
	ttl    time.Duration // the lease time; for a watchdog lease, its TTL

	// The nodes whose answer to the acquisition did not come in time: it
	// may still run there, so Release revokes it with revokeKey.
	ungranted []bool
	revokeKey string

	ctx    context.Context // cancelled with the lease's Err as cause when it ends
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	deadline time.Time
	expiry   *time.Timer
	err      error // why the lease ended; nil while held
	released bool  // Release reached a conclusion, kept in relErr
	relErr   error

	stopWatchdog context.CancelFunc // nil for fixed-TTL leases
	watchdogDone chan struct{}
}

var _ fence.Lease = (*lease)(nil)

func (l *Locker) newLease(ctx context.Context, name string, k keys, owner string, token fence.Token, ttl time.Duration, watchdog bool, sent time.Time) *lease {
	ls := &lease{locker: l, name: name, keys: k, owner: owner, token: token, ttl: ttl}
	ls.ctx, ls.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	ls.deadline = sent.Add(ttl - drift(ttl))
	ls.mu.Lock() // the timer may fire before ls.expiry is set
	defer ls.mu.Unlock()
	ls.expiry = time.AfterFunc(time.Until(ls.deadline), func() {
		ls.end(fmt.Errorf("%w: %q was not renewed on a majority before its deadline", fence.ErrLeaseLost, name))
	})
	if watchdog {
		var wdCtx context.Context
		wdCtx, ls.stopWatchdog = context.WithCancel(ls.ctx)
		ls.watchdogDone = make(chan struct{})
		go ls.keepRenewed(wdCtx)
	}
	return ls
}

func (ls *lease) Name() string             { return ls.name }
func (ls *lease) Token() fence.Token       { return ls.token }
func (ls *lease) Done() <-chan struct{}    { return ls.ctx.Done() }
func (ls *lease) Context() context.Context { return ls.ctx }
func (ls *lease) Deadline() time.Time      { ls.mu.Lock(); defer ls.mu.Unlock(); return ls.deadline }
func (ls *lease) Err() error               { ls.mu.Lock(); defer ls.mu.Unlock(); return ls.err }
func (ls *lease) String() string           { return fmt.Sprintf("redlock lease %q token %d", ls.name, ls.token) }

// end records why the lease ended and cancels its context; the first call wins.
func (ls *lease) end(why error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err != nil {
		return
	}
	ls.err = why
	ls.expiry.Stop()
	ls.cancel(why)
}

// keepRenewed is the watchdog: it renews the lease every third of its TTL
// until the lease ends or Release stops it. A failed renewal is retried
// sooner; the expiry timer ends the lease if no renewal reaches a majority
// before the deadline.
func (ls *lease) keepRenewed(ctx context.Context) {
	defer close(ls.watchdogDone)
	every := ls.ttl / 3
	timer := time.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		rctx, cancel := context.WithDeadline(ctx, ls.Deadline())
		err := ls.renew(rctx, ls.ttl)
		cancel()
		switch {
		case errors.Is(err, fence.ErrLeaseLost):
			return
		case err != nil:
			timer.Reset(every / 4)
		default:
			timer.Reset(every)
		}
	}
}

// renew moves the expiry on every node that still holds the lease. When a
// majority did so in time, it moves the deadline; when too few nodes still
// hold the lease for a majority to be possible, the lease is lost.
func (ls *lease) renew(ctx context.Context, ttl time.Duration) error {
	l := ls.locker
	sent := time.Now()
	rs := l.fanout(ctx, l.all(), l.timeoutFor(ttl), nil, func(ctx context.Context, c redis.UniversalClient) ([]int64, error) {
		n, err := extendScript.Run(ctx, c, []string{ls.keys.lock}, ls.owner, ttl.Milliseconds()).Int64()
		return []int64{n}, err
	})
	moved, gone, errs := tally(rs)
	if len(l.nodes)-gone < l.quorum {
		lost := fmt.Errorf("%w: %q was removed or taken by another owner on %d of %d nodes", fence.ErrLeaseLost, ls.name, gone, len(l.nodes))
		ls.end(lost)
		return lost
	}
	newDeadline := sent.Add(ttl - drift(ttl))
	if moved < l.quorum || !time.Now().Before(newDeadline) {
		why := fmt.Errorf("%w: extended on %d of %d nodes, %d needed", ErrNoQuorum, moved, len(l.nodes), l.quorum)
		return fmt.Errorf("redlock: extend %q: %w", ls.name, errors.Join(append([]error{why}, errs...)...))
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err != nil {
		return ls.err
	}
	ls.deadline = newDeadline
	ls.expiry.Reset(time.Until(newDeadline))
	return nil
}

// tally counts the nodes that answered 1 (done) and 0 (not this owner's
// lock) and collects the others' errors.
func tally(rs []result) (done, gone int, errs []error) {
	for _, r := range rs {
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
		case r.res[0] == 1:
			done++
		default:
			gone++
		}
	}
	return done, gone, errs
}

// Extend sets the lease to expire ttl from now on a majority of the nodes;
// see fence.Lease. A watchdog lease goes on being renewed with its watchdog
// TTL afterwards.
func (ls *lease) Extend(ctx context.Context, ttl time.Duration) error {
	if err := fence.ValidateTTL(ttl); err != nil {
		return err
	}
	if err := ls.Err(); err != nil {
		return err
	}
	return ls.renew(ctx, ttl)
}

// Release deletes the lock on every node where this lease still owns it;
// see fence.Lease. It returns nil when a majority deleted it, an error
// matching fence.ErrLeaseLost when too few nodes still held it for a
// majority, and otherwise the nodes' errors (call again to retry). The
// lease ends locally at once, whatever the nodes answer.
func (ls *lease) Release(ctx context.Context) error {
	ls.mu.Lock()
	if ls.released {
		defer ls.mu.Unlock()
		return ls.relErr
	}
	ls.mu.Unlock()
	if ls.stopWatchdog != nil {
		ls.stopWatchdog()
		<-ls.watchdogDone
	}
	l := ls.locker
	rs := l.fanout(ctx, l.all(), l.timeoutFor(ls.ttl), nil, func(ctx context.Context, c redis.UniversalClient) ([]int64, error) {
		keys, args := []string{ls.keys.lock}, []any{ls.owner}
		if ls.ungranted[l.index(c)] {
			keys, args = append(keys, ls.revokeKey), append(args, max(ls.ttl, revokeFor).Milliseconds())
		}
		n, err := releaseScript.Run(ctx, c, keys, args...).Int64()
		return []int64{n}, err
	})
	deleted, gone, errs := tally(rs)
	var err error
	lostBefore := ls.Err()
	switch {
	case lostBefore != nil && !errors.Is(lostBefore, fence.ErrReleased):
		err = lostBefore // conclusive: the lease was lost before Release
	case deleted >= l.quorum:
	case len(l.nodes)-gone < l.quorum:
		err = fmt.Errorf("%w: %q was removed or taken by another owner on %d of %d nodes", fence.ErrLeaseLost, ls.name, gone, len(l.nodes))
	default:
		ls.end(fence.ErrReleased)
		why := fmt.Errorf("%w: released on %d of %d nodes, %d needed", ErrNoQuorum, deleted, len(l.nodes), l.quorum)
		return fmt.Errorf("redlock: release %q: %w", ls.name, errors.Join(append([]error{why}, errs...)...))
	}
	if err == nil {
		ls.end(fence.ErrReleased)
	} else {
		ls.end(err)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if !ls.released {
		ls.released, ls.relErr = true, err
	}
	return ls.relErr
}
