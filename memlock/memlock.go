package memlock

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/nilctx"
)

// DefaultWatchdogTTL is the lease time of leases acquired without fence.TTL
// when Options.WatchdogTTL is zero. It is the same as redislock's default.
const DefaultWatchdogTTL = 30 * time.Second

// Options configure a Locker. A nil *Options means the defaults.
type Options struct {
	// WatchdogTTL is the lease time of leases acquired without fence.TTL;
	// their watchdog renews them every third of it. Zero means
	// DefaultWatchdogTTL.
	WatchdogTTL time.Duration

	// Observer, if not nil, is told of every acquisition and the end of
	// every lease, with Backend "memory"; see fence.Observer. It is called
	// once the Locker's mutex is unlocked, on the goroutine that ended the
	// lease (the caller of Release, Extend, Err or Remove, or the lease's
	// timer): it may call the Locker and the lease.
	Observer fence.Observer

	_ struct{}
}

// Locker is an in-memory fence.Locker. It is safe for concurrent use. The
// zero value is ready to use, with DefaultWatchdogTTL; a Locker must not be
// copied after first use.
type Locker struct {
	watchdogTTL time.Duration  // zero: DefaultWatchdogTTL
	obs         fence.Observer // nil: none

	mu    sync.Mutex
	last  fence.Token      // the last token issued, for any name
	locks map[string]*lock // held locks only; a lock is deleted when freed
	// ended holds the ends of leases not reported yet to obs: they are
	// reported once l.mu is unlocked (see unlock).
	ended []fence.LeaseEvent
}

// unlock unlocks l.mu, then reports to the Observer the ends of leases
// recorded under it: its callback may call the lease's methods, which take
// l.mu (a report made under it deadlocked such a callback).
func (l *Locker) unlock() {
	evs := l.ended
	l.ended = nil
	l.mu.Unlock()
	for _, ev := range evs {
		l.obs.LeaseEnded(ev)
	}
}

// unlockGranted is unlock for an Acquire that has just granted ls: the
// ends it reports may include the expiry of the holder that Acquire found
// lapsed. If the Observer panics there, Acquire does not return ls, and
// nobody could release it: it is given up (as never granted, its end not
// reported), so that its watchdog does not keep the lock for ever.
func (l *Locker) unlockGranted(ls *lease) {
	returned := false
	defer func() {
		if !returned {
			l.mu.Lock()
			l.endLockedAs(ls, fence.ErrReleased, "")
			ls.released = true
			l.unlock()
		}
	}()
	l.unlock()
	returned = true
}

var _ fence.Locker = (*Locker)(nil)

// lock is a held lock and the callers waiting for it, first come first.
// While a lock has waiters it has a holder: freeing it hands it to the first
// waiter at once.
type lock struct {
	holder  *lease
	waiters []*waiter
}

// waiter is an Acquire waiting for a held lock. A hand-off sends the new
// lease on granted, which has room for it, so the hand-off never blocks.
type waiter struct {
	ctx     context.Context
	opts    fence.Options
	granted chan *lease
}

// New returns a Locker with the options o, which may be nil. It returns an
// error matching fence.ErrInvalidOption if o.WatchdogTTL is negative or
// shorter than fence.MinTTL (10 ms), as a fence.TTL would be.
func New(o *Options) (*Locker, error) {
	l := &Locker{}
	if o != nil {
		if err := fence.ValidateObserver(o.Observer); err != nil {
			return nil, fmt.Errorf("memlock: %w", err)
		}
		l.obs = o.Observer
	}
	if o != nil && o.WatchdogTTL != 0 {
		if err := fence.ValidateTTL(o.WatchdogTTL); err != nil {
			return nil, fmt.Errorf("memlock: watchdog TTL: %w", err)
		}
		l.watchdogTTL = o.WatchdogTTL
	}
	return l, nil
}

// Acquire takes the lock called name; see fence.Locker. With a Wait budget
// it waits in line: a release, an expiry or Remove hands the lock to the
// caller that has waited longest. A waiter whose goroutine wakes only after
// the lease handed to it has run out (a stalled process) waits in line
// again within its budget, or fails saying it woke too late; it never
// returns a lease already ended. When the budget runs out the error wraps
// fence.ErrHeld; when ctx ends first, ctx.Err(). A nil ctx, or a nil
// *Locker, returns an error matching fence.ErrInvalidOption.
func (l *Locker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: memlock: Acquire on a nil *Locker (was New's error ignored?)", fence.ErrInvalidOption)
	}
	if ctx == nil {
		return nil, nilctx.Err("memlock", "Acquire")
	}
	if l.obs == nil {
		return l.acquire(ctx, name, opts...)
	}
	start := time.Now()
	lease, err := l.acquire(ctx, name, opts...)
	fence.ReportAcquire(l.obs, backend, name, start, lease, err)
	return lease, err
}

// backend is the Backend of the events this package reports.
const backend = "memory"

func (l *Locker) acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	if err := fence.ValidateName(name); err != nil {
		return nil, err
	}
	o, err := fence.Apply(opts)
	if err != nil {
		return nil, err
	}
	return l.acquireWith(ctx, name, o)
}

// testHookGranted, if set, runs as a waiter takes the lease handed to it
// (a test's stand-in for a goroutine woken late).
var testHookGranted func()

// testHookWaiting, if set, runs as a waiter, queued, is about to wait (a
// test's stand-in for a goroutine stalled there).
var testHookWaiting func()

// acquireWith is acquire with its options applied.
func (l *Locker) acquireWith(ctx context.Context, name string, o fence.Options) (fence.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, fence.NotAcquired(name, err)
	}

	l.mu.Lock()
	lk := l.locks[name]
	if lk != nil {
		l.expireLocked(lk.holder, time.Now())
		lk = l.locks[name]
	}
	if lk == nil {
		if l.locks == nil {
			l.locks = make(map[string]*lock)
		}
		lk = &lock{}
		l.locks[name] = lk
		ls := l.grantLocked(ctx, name, lk, o)
		l.unlockGranted(ls)
		return ls, nil
	}
	if o.Wait == 0 {
		l.unlock()
		return nil, fence.NotAcquired(name, fence.ErrHeld)
	}
	w := &waiter{ctx: ctx, opts: o, granted: make(chan *lease, 1)}
	lk.waiters = append(lk.waiters, w)
	l.unlock()

	end := time.Now().Add(o.Wait)
	budget := time.NewTimer(o.Wait)
	defer budget.Stop()
	if testHookWaiting != nil {
		testHookWaiting()
	}
	var why error
	select {
	case ls := <-w.granted:
		if testHookGranted != nil {
			testHookGranted()
		}
		if lerr := l.endedOnArrival(ls); lerr != nil {
			// Handed over, but this goroutine woke after the lease's
			// time had run out (a stalled process): the lock went on
			// at the lease's end. Wait in line again, within the
			// budget.
			if o.Wait = time.Until(end); o.Wait > 0 {
				return l.acquireWith(ctx, name, o)
			}
			return nil, fence.NotAcquired(name, fmt.Errorf("memlock: woke too late for the lease handed to it: %w", lerr))
		}
		return ls, nil
	case <-budget.C:
		why = fence.ErrHeld
	case <-ctx.Done():
		why = ctx.Err()
	}

	l.mu.Lock()
	if i := slices.Index(lk.waiters, w); i >= 0 {
		lk.waiters = slices.Delete(lk.waiters, i, i+1)
		l.unlock()
		return nil, fence.NotAcquired(name, why)
	}
	// The lock was handed over just as the wait ended.
	ls := <-w.granted
	if err := ctx.Err(); err != nil {
		// The caller has gone: pass the lock on rather than keep it held
		// until it expires. The lease was never granted (Acquire reports
		// it as not acquired): its end is not reported either.
		l.endLockedAs(ls, fence.ErrReleased, "")
		ls.released = true
		l.unlock()
		return nil, fence.NotAcquired(name, err)
	}
	if l.expireLocked(ls, time.Now()); ls.err != nil {
		// Handed over while this goroutine was stalled past the lease's
		// time as well as the budget (select picked the budget): the
		// lock went on at the lease's end.
		l.unlock()
		return nil, fence.NotAcquired(name, fmt.Errorf("memlock: woke too late for the lease handed to it: %w", ls.err))
	}
	ls.handed = false
	l.unlock()
	return ls, nil // granted within the budget
}

// Remove deletes the lock called name behind its holder's back, as an
// operator or a failover would: the holder's lease ends with an error
// matching fence.ErrLeaseLost, and the lock goes to the longest waiter, if
// any. Remove reports whether the lock was held (never, on a nil *Locker).
func (l *Locker) Remove(name string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.unlock()
	lk := l.locks[name]
	if lk == nil {
		return false
	}
	if lk.holder.unfreed { // ended already, by a Release that failed
		l.freeLocked(lk.holder)
		return true
	}
	l.endLockedAs(lk.holder, fmt.Errorf("%w: %q was removed", fence.ErrLeaseLost, name), fence.LostRemoved)
	return true
}

// endedOnArrival returns the Err of a lease handed to a waiter that ended
// before the waiter took it (its deadline passed, or it was removed), or
// nil.
func (l *Locker) endedOnArrival(ls *lease) error {
	l.mu.Lock()
	defer l.unlock()
	l.expireLocked(ls, time.Now())
	if ls.err == nil {
		ls.handed = false // returned: its end is reported
	}
	return ls.err
}

// grantLocked makes a new lease the holder of lk. The caller holds l.mu.
func (l *Locker) grantLocked(ctx context.Context, name string, lk *lock, o fence.Options) *lease {
	l.last++
	ls := &lease{l: l, name: name, token: l.last, ttl: o.TTL, granted: time.Now()}
	if ls.ttl == 0 {
		ls.watchdog = true
		ls.ttl = cmp.Or(l.watchdogTTL, DefaultWatchdogTTL)
	}
	ls.ctx, ls.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	ls.setDeadline(time.Now().Add(ls.ttl))
	next := ls.ttl
	if ls.watchdog {
		next = ls.ttl / 3
	}
	ls.timer = time.AfterFunc(next, ls.tick)
	lk.holder = ls
	return ls
}

// expireLocked ends ls if its deadline has passed at now, in case its timer
// has not fired yet, and frees the lock of an unfreed lease whose deadline
// has passed. The caller holds l.mu.
func (l *Locker) expireLocked(ls *lease, now time.Time) {
	if ls.unfreed && !now.Before(ls.deadline) {
		l.freeLocked(ls)
		return
	}
	if ls.err == nil && !now.Before(ls.deadline) {
		cause := fence.LostExpired
		if ls.watchdog {
			cause = fence.LostRenewFailed // the watchdog's timer ran too late
		}
		l.endLockedAs(ls, fmt.Errorf("%w: %q expired at %v", fence.ErrLeaseLost, ls.name, ls.deadline.Format(time.RFC3339Nano)), cause)
	}
}

// endLocked ends ls with why, if it has not ended yet, and frees its lock:
// the first waiter gets it, or the lock is deleted. The caller holds l.mu.
func (l *Locker) endLocked(ls *lease, why error) { l.endLockedAs(ls, why, fence.Released) }

// endLockedAs is endLocked with the cause reported to the Observer ("": a
// lease that no Acquire returned, whose end is not reported).
func (l *Locker) endLockedAs(ls *lease, why error, cause fence.LeaseCause) {
	if ls.err != nil {
		return
	}
	ls.err = why
	ls.timer.Stop()
	ls.cancel(why)
	if l.obs != nil && cause != "" && !ls.handed { // reported by unlock
		l.ended = append(l.ended, fence.LeaseEvent{Backend: backend, Name: ls.name, Token: ls.token, Cause: cause, Held: time.Since(ls.granted), Err: why})
	}
	l.freeLocked(ls)
}

// endUnfreedLocked ends ls as released, but leaves its lock held by it
// until its deadline (or a Release retried in time), as a Release that
// could not reach a server leaves it: for a Release whose ctx was done.
// The caller holds l.mu; ls has not ended.
func (l *Locker) endUnfreedLocked(ls *lease) {
	ls.err = fence.ErrReleased
	ls.unfreed = true
	ls.watchdog = false // tick frees the lock at its deadline
	ls.timer.Reset(max(time.Until(ls.deadline), 0))
	ls.cancel(fence.ErrReleased)
	if l.obs != nil {
		l.ended = append(l.ended, fence.LeaseEvent{Backend: backend, Name: ls.name, Token: ls.token, Cause: fence.Released, Held: time.Since(ls.granted), Err: fence.ErrReleased})
	}
}

// freeLocked frees the lock of ls, if ls still holds it: the first waiter
// gets it, or the lock is deleted. The caller holds l.mu.
func (l *Locker) freeLocked(ls *lease) {
	ls.unfreed = false
	lk := l.locks[ls.name]
	if lk == nil || lk.holder != ls {
		return
	}
	lk.holder = nil
	if len(lk.waiters) == 0 {
		delete(l.locks, ls.name)
		return
	}
	w := lk.waiters[0]
	lk.waiters = slices.Delete(lk.waiters, 0, 1)
	next := l.grantLocked(w.ctx, ls.name, lk, w.opts)
	next.handed = true
	w.granted <- next
}
