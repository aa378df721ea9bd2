package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/atomictime"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/fencekit/fence/internal/releasectx"
)

// lease is a lock held on Redis. Its expiry timer ends it at the local
// deadline unless a renewal moved the deadline first; a watchdog lease has a
// goroutine that renews it every third of its TTL.
//
// A fixed-TTL lease that nobody watches (no Observer or Logger to tell of
// its end at the deadline, and Context and Done not called yet) has neither
// a context nor a timer: Err finds the deadline passed by reading the
// clock, and the first call of Context or Done makes both, already ended
// if the lease has. Most leases are released well before their deadline
// without either.
type lease struct {
	locker  *Locker
	attempt attempt // the acquisition's name, keys, owner and TTL
	token   fence.Token
	parent  context.Context // the acquisition's: Context's values

	// ctx is cancelled with the lease's Err as cause when it ends; nil
	// until Context or Done is called (always set for watchdog leases, and
	// set, with expiry, for observed ones). Guarded by mu.
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	deadline time.Time
	dl       atomictime.Time // deadline's copy for Deadline, which never blocks
	// The server's clock read by the last successful acquire or renew
	// script (ms), and the local time its reply arrived: the script ran
	// before that, so at local time t the server's clock reads at least
	// serverAt + (t - repliedAt), give or take the clocks' rates. This maps
	// the deadline to the server's clock without the local wall clock.
	serverAt  int64
	repliedAt time.Time
	expiry    *time.Timer // nil while nobody watches (see lease)
	err       error       // why the lease ended; nil while held
	released  bool        // Release reached a conclusion, kept in releaseErr
	relErr    error
	// releasing: a Release is in flight. A concurrent Release waits for
	// it (on releaseWait, made by the first to wait and closed when the
	// one in flight is done) rather than run the script again, whose
	// "not the owner" would report a released lease lost (the first
	// Release's reply may come later than the second's: it may wait for a
	// replica's WAIT, see Locker.releaseLease).
	releasing   bool
	releaseWait chan struct{}
	// relTried: a Release failed, whose script may have run all the same
	// (ctx ended during its round trip, the connection broke, go-redis
	// tried it again), or a give-back of the lease's own was started. A
	// later Release that finds the lock not its own cannot tell that
	// delete from a loss, and reports a release (fence.Lease's Release).
	relTried bool
	granted  time.Time // when the acquire reply arrived, for the hold time

	stopWatchdog context.CancelFunc // nil for fixed-TTL leases
	watchdogDone chan struct{}
	// logging: the watchdog is logging a failed renewal, with no renewal
	// under way, and renews no more if stopped meanwhile (see logFailed):
	// Release does not wait for it, as the Logger's handler may be what
	// calls Release.
	logging bool
	stopped bool // Release stopped the watchdog: it logs no more

	// ahead: a renewal that did not move the deadline moved the lock's
	// expiry on Redis, or may have (its reply was lost, or came after the
	// caller gave up on it): the lock may outlive the deadline by up to
	// that renewal's TTL, held by nobody. Unless the lease is released
	// (Release deletes the lock), the lock is given back when the lease
	// ends (endAs).
	ahead bool
	// unfreed: a Release that failed ended the lease without deleting
	// the lock; a lock that a renewal moved ahead is given back as after
	// an unreleased end.
	unfreed bool
}

var _ fence.Lease = (*lease)(nil)

func (l *Locker) newLease(ctx context.Context, a *attempt, token fence.Token, sent, replied time.Time, serverMs int64) *lease {
	ls := a.home
	if ls == nil || ls.locker != nil { // tried again after a success
		ls = &lease{attempt: *a}
	}
	ls.attempt.home = nil
	ls.locker, ls.token, ls.parent, ls.serverAt, ls.repliedAt, ls.granted = l, token, ctx, serverMs, replied, replied
	ls.setDeadline(deadline(sent, a.ttl))
	if !a.watchdog && l.obs == nil && l.log == nil {
		return ls // context and timer on demand
	}
	ls.mu.Lock() // the timer may fire before ls.expiry is set
	defer ls.mu.Unlock()
	ls.watch()
	if a.watchdog {
		var wdCtx context.Context
		wdCtx, ls.stopWatchdog = context.WithCancel(ls.ctx)
		ls.watchdogDone = make(chan struct{})
		go ls.keepRenewed(wdCtx)
	}
	return ls
}

// watch makes the lease's context and expiry timer, unless made already;
// the context is cancelled at once if the lease has ended. ls.mu is held.
func (ls *lease) watch() {
	if ls.ctx != nil {
		return
	}
	ls.ctx, ls.cancel = context.WithCancelCause(context.WithoutCancel(ls.parent))
	if ls.err != nil {
		ls.cancel(ls.err)
		return
	}
	ls.expiry = time.AfterFunc(time.Until(ls.deadline), ls.expire)
}

// expire ends the lease at its deadline.
func (ls *lease) expire() { ls.expireLater()() }

// expireLater is expire, but returns the report of the end (see endAs).
func (ls *lease) expireLater() (report func()) {
	if ls.attempt.watchdog {
		// The watchdog's renewals failed until the deadline.
		return ls.endAsIf(true, fmt.Errorf("%w: %q was not renewed before its deadline", fence.ErrLeaseLost, ls.attempt.name), fence.LostRenewFailed)
	}
	return ls.endAsIf(true, fmt.Errorf("%w: %q: its lease time ran out", fence.ErrLeaseLost, ls.attempt.name), fence.LostExpired)
}

// expireIfDue ends a lease whose deadline has passed, as its expiry timer
// does: a lease may have none (made only when needed), or one whose
// goroutine has not run yet. Err and Release must not answer "held" in that
// gap: an Observer, a Logger or a call of Done gives a lease a timer, and
// would otherwise change their answers
// (TestObservedLeaseEndsAtDeadlineBeforeItsTimer). The end is reported
// once, by whichever ends it.
func (ls *lease) expireIfDue() {
	if report := ls.expireDue(); report != nil {
		report()
	}
}

// expireDue ends the lease if it is past its deadline, as expireIfDue, and
// returns the report of that end; nil if it was not due. The report is a
// no-op if the lease did not end here after all (a renewal moved the
// deadline since due said, or another end came first).
func (ls *lease) expireDue() (report func()) {
	if !ls.due() {
		return nil
	}
	return ls.expireLater()
}

// alsoReport makes *report make also first.
func alsoReport(report *func(), also func()) {
	other := *report
	*report = func() { also(); other() }
}

// due reports whether the lease is held and past its deadline.
func (ls *lease) due() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.err == nil && !time.Now().Before(ls.deadline)
}

// deadline is when a lease of ttl requested at sent is known to be held:
// Redis may count from later than sent, never earlier, and the two clocks
// may run at slightly different rates (1% plus 2 ms, Redlock's allowance).
func deadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - ttl/100 - 2*time.Millisecond)
}

func (ls *lease) Name() string          { return ls.attempt.name }
func (ls *lease) Token() fence.Token    { return ls.token }
func (ls *lease) Done() <-chan struct{} { return ls.Context().Done() }
func (ls *lease) Deadline() time.Time   { return ls.dl.Load() }

// setDeadline sets the deadline, under ls.mu, and the copy that Deadline
// reads without it.
func (ls *lease) setDeadline(d time.Time) { ls.deadline = d; ls.dl.Store(d) }
func (ls *lease) String() string          { return fmt.Sprintf("lease %q token %d", ls.attempt.name, ls.token) }

func (ls *lease) Context() context.Context {
	ls.expireIfDue()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.watch()
	return ls.ctx
}

func (ls *lease) Err() error {
	ls.expireIfDue()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.err
}

// end records why the lease ended and cancels its context; the first call
// wins. The cause it reports is Released for fence.ErrReleased, LostRemoved
// otherwise; see endAs.
func (ls *lease) end(why error) (report func()) { return ls.endAs(why, "") }

// endAs is end with the cause to report to the Observer and the Logger
// ("": from why, as end says). It returns the report (never nil; a no-op
// when this call did not end the lease), for the caller to make once it
// waits for nothing that the callback may wait for in turn: the callback
// may call Release, which waits for the watchdog's goroutine to end, and
// whose result must be settled before a Release of the callback returns it.
func (ls *lease) endAs(why error, cause fence.LeaseCause) (report func()) {
	return ls.endAsIf(false, why, cause)
}

// endAsIf is endAs; with due, only if the deadline has passed: the expiry
// timer may fire as a renewal moves the deadline (renew holds ls.mu, and
// its Reset runs the timer's function again at the new deadline).
func (ls *lease) endAsIf(due bool, why error, cause fence.LeaseCause) (report func()) {
	ls.mu.Lock()
	if ls.err != nil || due && time.Now().Before(ls.deadline) {
		ls.mu.Unlock()
		return func() {}
	}
	ls.err = why
	if ls.expiry != nil {
		ls.expiry.Stop()
	}
	if ls.cancel != nil {
		ls.cancel(why)
	}
	giveBack := ls.ahead && ls.unfreedBy(why)
	ls.ahead = false
	ls.relTried = ls.relTried || giveBack // a retried Release may find it gone by this
	ls.mu.Unlock()
	if giveBack {
		// Owner-checked: deleted only if still this lease's.
		go ls.locker.releaseAbandoned(ls.attempt)
	}
	if l := ls.locker; l.log == nil && l.obs == nil {
		return func() {} // nobody to tell: no closure to allocate
	}
	if cause == "" {
		cause = fence.LostRemoved
		if errors.Is(why, fence.ErrReleased) {
			cause = fence.Released
		}
	}
	return func() { ls.locker.leaseEnded(ls, cause, why) }
}

// endReleasing ends a held lease as Release is about to send the script
// that frees its lock; releasedAs reports the end once the script's reply
// says how it ended. It reports whether this call ended the lease.
func (ls *lease) endReleasing() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err != nil {
		return false
	}
	ls.err = fence.ErrReleased
	if ls.expiry != nil {
		ls.expiry.Stop()
	}
	if ls.cancel != nil {
		ls.cancel(fence.ErrReleased)
	}
	return true
}

// releasedAs settles the end of a lease that endReleasing ended, by what
// its Release returns, and returns the report: a loss (the lock was no
// longer the lease's) as LostRemoved, and Err says so too (the Context's
// cause stays fence.ErrReleased); anything else as Released. failed: the
// script's outcome is unknown, so the lock may still be held, and a lock
// that a renewal moved ahead is given back as after an unreleased end.
func (ls *lease) releasedAs(result error, failed bool) (report func()) {
	ls.mu.Lock()
	cause, why := fence.Released, error(fence.ErrReleased)
	if !failed && result != nil {
		cause, why = fence.LostRemoved, result
		ls.err = result
	}
	giveBack := failed && ls.ahead
	if failed {
		ls.unfreed = true
		ls.ahead = false
	}
	// A Release retried later may find the lock gone by this give-back,
	// the lease's own delete, even after a call that sent nothing.
	ls.relTried = ls.relTried || giveBack
	ls.mu.Unlock()
	if giveBack {
		go ls.locker.releaseAbandoned(ls.attempt)
	}
	if l := ls.locker; l.log == nil && l.obs == nil {
		return func() {}
	}
	return func() { ls.locker.leaseEnded(ls, cause, why) }
}

// unfreedBy reports whether a lease ended by why left the lock on Redis:
// anything but a Release, or a Release that failed (unfreed). ls.mu is
// held.
func (ls *lease) unfreedBy(why error) bool {
	return !errors.Is(why, fence.ErrReleased) || ls.unfreed
}

// triedRelease reports whether an earlier Release's script failed, maybe
// after it ran (see relTried).
func (ls *lease) triedRelease() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.relTried
}

// endUnfreed ends the lease as released, for a Release that failed to
// delete the lock: a lock that a renewal moved ahead of the deadline is
// then given back as after an unreleased end (see ahead).
func (ls *lease) endUnfreed() (report func()) {
	ls.mu.Lock()
	if ls.err == nil {
		ls.unfreed = true
	}
	ls.mu.Unlock()
	return ls.end(fence.ErrReleased)
}

// keepRenewed is the watchdog: it renews the lease every third of its TTL until
// the lease ends or Release stops it. A failed renewal is retried sooner;
// the expiry timer ends the lease if none succeeds before the deadline.
// When a renewal ends the lease, the end is reported once the watchdog is
// done (watchdogDone closed): the callback told may call Release, which
// waits for that.
func (ls *lease) keepRenewed(ctx context.Context) {
	report := ls.renewLoop(ctx)
	close(ls.watchdogDone)
	report()
}

// renewLoop is keepRenewed's loop; it returns the report of the lease's end
// when a renewal ended it.
func (ls *lease) renewLoop(ctx context.Context) (report func()) {
	every := ls.attempt.ttl / 3
	timer := time.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return func() {}
		case <-timer.C:
		}
		rctx, cancel := context.WithDeadline(ctx, ls.Deadline())
		report, err := ls.renew(rctx, ls.attempt.ttl)
		cancel()
		switch {
		case errors.Is(err, fence.ErrLeaseLost):
			return report
		case err != nil:
			if !ls.logFailed(ctx, err) {
				return func() {} // stopped while it logged
			}
			if ls.closedForGood(ctx, err) {
				// Nothing will renew it: it ends now, not at its
				// deadline (the watchdog TTL, 30 s by default, for a fn
				// that could not be told), with an error that fence.Lead
				// stops on.
				return ls.endAs(fmt.Errorf("%w: %q: its client was closed, and nothing can renew it: %w", fence.ErrLeaseLost, ls.attempt.name, closedClient(err)), fence.LostRenewFailed)
			}
			timer.Reset(every / 4)
		default:
			timer.Reset(every)
		}
	}
}

// closedForGood is the Locker's closedForGood, its probe bounded by the
// lease's deadline: a client that is not closed may not answer.
func (ls *lease) closedForGood(ctx context.Context, err error) bool {
	ctx, cancel := context.WithDeadline(ctx, ls.Deadline())
	defer cancel()
	return ls.locker.closedForGood(ctx, err)
}

// logFailed logs a failed renewal of the watchdog's, marked as logging,
// and reports whether the watchdog may go on (false: Release stopped it
// meanwhile). The handler may call Release, which stops the watchdog and
// would wait for it to return, that is for the handler: a deadlock. Release
// does not wait for a watchdog marked logging, and that is safe: what
// Release waits for is a renewal in flight, which could end the lease as
// lost after Release deleted the lock, and there is none: this renewal has
// returned, and the watchdog starts no other once it has seen, under ls.mu
// here, that it was stopped (Release sets ls.stopped as it reads logging,
// under ls.mu, so a Release that did not wait is seen). The watchdog then
// returns on its own, once the handler has. Conversely a watchdog that
// finds ls.stopped before it logs does not log: a Release may be waiting
// for it (and a renewal cut short by Release is no failure).
func (ls *lease) logFailed(ctx context.Context, err error) bool {
	ls.mu.Lock()
	if ls.stopped {
		// A renewal that Release cut short is no failure, and a Release
		// that read logging false waits for this goroutine.
		ls.mu.Unlock()
		return false
	}
	ls.logging = true
	ls.mu.Unlock()
	ls.locker.renewFailed(ls, err)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.logging = false
	return !ls.stopped && ctx.Err() == nil
}

// renew runs the extend script. On success it moves the deadline; when the
// lock is gone or owned by someone else it ends the lease, and returns the
// report of the end (never nil; see endAs).
func (ls *lease) renew(ctx context.Context, ttl time.Duration) (report func(), _ error) {
	report = func() {}
	ls.mu.Lock()
	// The deadline on the server's clock, erring early by the 1% that
	// deadline allows for the clocks' rates and by a millisecond of
	// rounding: a renewal run later than that is refused (extend.lua), so a
	// renewal delayed past the deadline cannot hold the lock for a lease
	// nobody uses. One run just before it is refused too, and ends the
	// lease; its reply would have come too late to be of use anyway.
	left := ls.deadline.Sub(ls.repliedAt)
	serverDeadline := ls.serverAt + (left - left/100).Milliseconds() - 1
	ls.mu.Unlock()
	sent := time.Now()
	r, err := ls.locker.evalBounded(ctx, func(r synced, err error) {
		// Given up on, but it moved the expiry after all (or may have:
		// no reply): the deadline did not move, so the lock is given
		// back when the lease ends, at once if it has.
		if err != nil || r.reply == nil {
			ls.movedAhead()
			return
		}
		if res, _ := r.reply.Int64Slice(); len(res) == 2 && res[0] == 1 {
			ls.movedAhead()
		}
	}, extendScript, skeys{names: ls.attempt.acquireKeys[:1], boxed: ls.attempt.acquireBoxed[:1]}, ls.attempt.ownerArg, ttl.Milliseconds(), serverDeadline)
	replied := time.Now()
	acked, required := r.acked, r.required
	// The script's reply was read, WAIT's did not come in time: judged by
	// the reply below, a renewal refused as not replicated.
	unanswered, waitErr := unansweredWait(err), err
	if unanswered != nil && required > 0 && r.reply != nil && r.reply.Err() == nil {
		err, acked = nil, 0
	} else {
		unanswered = nil
	}
	var res []int64
	if err == nil {
		res, err = r.reply.Int64Slice()
	}
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("unexpected reply %v", res)
	}
	if err != nil {
		if !errors.Is(err, errGaveUp) { // given up on: see abandoned above
			ls.movedAhead() // it may have run
		}
		return report, fmt.Errorf("redislock: extend %q: %w", ls.attempt.name, err)
	}
	n := res[0]
	if n == -1 {
		late := fmt.Errorf("%w: %q: the renewal reached Redis after the lease's deadline", fence.ErrLeaseLost, ls.attempt.name)
		return ls.endAs(late, fence.LostRenewLate), late
	}
	if n == 1 && acked < required {
		ls.movedAhead() // on the primary
		ls.locker.syncRefused(ctx, ls.attempt.name, ls.token, true, acked, required)
		var notRepl error = &fence.NotReplicatedError{Acked: acked, Required: required}
		if unanswered != nil {
			notRepl = notAnswered(notRepl, unanswered, waitErr)
		}
		return report, fmt.Errorf("redislock: extend %q: %w", ls.attempt.name, notRepl)
	}
	if n == 0 {
		lost := fmt.Errorf("%w: %q was removed or taken by another owner", fence.ErrLeaseLost, ls.attempt.name)
		return ls.end(lost), lost
	}
	// Run in time by the server's clock (extend.lua refuses a late
	// renewal): the lock was held throughout, and the lease goes on with
	// the new deadline, even if the old one passed while the reply was on
	// its way, unless something ended it meanwhile (its timer, or Err,
	// Context, Release or Extend, which end a lease past its deadline:
	// once told, the lease stays ended). With or without a timer (an
	// Observer, a Logger, a call of Done), the same reply gives the same
	// answer, as in redlock (TestRenewalReadPastDeadlineKeepsLease).
	ls.mu.Lock()
	if err := ls.err; err != nil {
		// It moved the lock, but its reply came after the lease ended:
		// nobody will use the lock; give it back.
		ls.mu.Unlock()
		ls.movedAhead()
		return report, releasedAsLost(ls.attempt.name, err)
	}
	defer ls.mu.Unlock()
	ls.setDeadline(deadline(sent, ttl))
	ls.serverAt, ls.repliedAt = res[1], replied
	if ls.expiry != nil {
		ls.expiry.Reset(time.Until(ls.deadline))
	}
	return report, nil
}

// movedAhead records that a renewal which did not move the deadline moved
// the lock's expiry, or may have: the lock is given back when the lease
// ends unreleased (endAs), at once if it has already. A lease without a
// timer gets one, so that it ends, and gives the lock back, at its
// deadline even if nobody looks.
func (ls *lease) movedAhead() {
	ls.mu.Lock()
	if ls.err == nil {
		ls.ahead = true
		ls.watch()
		ls.mu.Unlock()
		return
	}
	unfreed := ls.unfreedBy(ls.err)
	if !unfreed && !ls.released {
		ls.ahead = true // a Release in flight: given back if it fails (releasedAs)
	}
	ls.relTried = ls.relTried || unfreed // a retried Release may find it gone by this
	ls.mu.Unlock()
	if unfreed {
		go ls.locker.releaseAbandoned(ls.attempt)
	}
}

// Extend sets the lease to expire ttl from now; see fence.Lease. A watchdog
// lease goes on being renewed with its watchdog TTL afterwards, at its
// next renewal as scheduled: a ttl that ends before that renewal ends the
// lease at its new Deadline (the lock, which no renewal moves earlier,
// expires when the last renewal said).
func (ls *lease) Extend(ctx context.Context, ttl time.Duration) error {
	if ctx == nil {
		return nilctx.Err("redislock", "Extend")
	}
	if err := fence.ValidateTTL(ttl); err != nil {
		return err
	}
	if err := ls.Err(); err != nil {
		return releasedAsLost(ls.attempt.name, err)
	}
	report, err := ls.renew(ctx, ttl)
	report()
	return err
}

// releasedAsLost is Extend's error for a lease that ended with err: a
// released lease is no longer its holder's, as the contract says, so
// ErrReleased comes with ErrLeaseLost.
func releasedAsLost(name string, err error) error {
	if err == fence.ErrReleased {
		return fmt.Errorf("%w: %q: %w", fence.ErrLeaseLost, name, err)
	}
	return err
}

// Release deletes the lock if this lease still owns it; see fence.Lease.
// The lease ends locally at once, before the script that frees the lock
// (and may grant it to a waiter) is sent, whatever the server answers; if
// the script finds the lock no longer the lease's, Err then says it was
// lost (Context's cause stays fence.ErrReleased). A Release retried after
// one that failed (its ctx ended during the round trip, its reply lost)
// finds the lock gone, or another's, if that first script ran after all:
// it cannot always tell that delete from a loss, and returns nil, as
// fence.Lease says (the released-by record of the package doc answers for
// the first script for what was left of the lock's expiry, unless another
// owner's release came between). Its end is reported to the Observer and the Logger once
// Release's result is settled: a Release called by their callback returns
// it.
func (ls *lease) Release(ctx context.Context) error {
	if ctx == nil {
		return nilctx.Err("redislock", "Release")
	}
	report, err := ls.release(ctx)
	report()
	return err
}

// release is Release, but returns the report of the lease's end (never nil;
// see endAs).
func (ls *lease) release(ctx context.Context) (report func(), _ error) {
	// The lease ends before the script is sent: a ctx that its end cancels
	// (its Context, or fence.Run's fn's) must not cancel the script; it
	// ends at the lease's deadline instead, as the lease's expiry ended it
	// before. Only a lease whose context was made can have one. Detached
	// before waiting for a Release in flight too: that one's end of the
	// lease must not make this call give up waiting for its result.
	ls.mu.Lock()
	watched := ls.ctx != nil
	ls.mu.Unlock()
	if watched {
		// Bounded by the deadline as the lease ends, not as this call
		// starts: the watchdog's renewal that it waits for below may
		// move it (even one read past the old deadline: see renew).
		var stop func()
		ctx, stop = releasectx.DetachBy(ctx, ls.Deadline)
		defer stop()
	}
	for {
		ls.mu.Lock()
		if ls.released {
			defer ls.mu.Unlock()
			return func() {}, ls.relErr
		}
		if !ls.releasing {
			ls.releasing = true
			ls.mu.Unlock()
			break
		}
		if ls.releaseWait == nil {
			ls.releaseWait = make(chan struct{})
		}
		busy := ls.releaseWait
		ls.mu.Unlock()
		select {
		case <-busy: // concluded (released), or failed: then try again
		case <-ctx.Done():
			return func() {}, fmt.Errorf("redislock: release %q: another Release of the lease is in flight: %w", ls.attempt.name, ctx.Err())
		}
	}
	defer func() {
		ls.mu.Lock()
		ls.releasing = false
		if ls.releaseWait != nil {
			close(ls.releaseWait)
			ls.releaseWait = nil
		}
		ls.mu.Unlock()
	}()
	// A deadline that has passed ends the lease here, as Err would: first
	// before Release waits for the watchdog's renewal in flight (that
	// renewal, run in time but read late, would otherwise keep the lease:
	// see renew; TestReleaseWaitingForKeptRenewal), then once more after
	// it. The end is reported as this call returns, beside this call's own
	// report (reported here, a callback's Release would wait for this
	// one). Any but one of these reports is a no-op: expireDue may find
	// that a renewal moved the deadline, and then this call releases the
	// lease.
	if expired := ls.expireDue(); expired != nil {
		defer alsoReport(&report, expired)
	}
	if ls.stopWatchdog != nil {
		// A renewal in flight ends soon after the watchdog is stopped,
		// unless it was called straight through (a client that bounds
		// its own calls): then only its deadline, the lease's, or the
		// client's read timeout ends it on a hung server. Wait no longer
		// than ctx: the renewal is owner-checked and cannot recreate a
		// lock that the release deletes, and what it finds later cannot
		// change how the lease ended.
		ls.stopWatchdog()
		ls.mu.Lock()
		ls.stopped = true
		logging := ls.logging // renewing no more: see logFailed
		ls.mu.Unlock()
		select {
		case <-ls.watchdogDone:
		default:
			if logging {
				break
			}
			select {
			case <-ls.watchdogDone:
			case <-ctx.Done():
				return ls.endUnfreed(), fmt.Errorf("redislock: release %q: the watchdog's renewal is still running: %w", ls.attempt.name, ctx.Err())
			}
		}
	}
	// Lost before Release was called, not while its round trip ran: a
	// deadline that passes while the script deletes the lock it still
	// owned is a release, not a loss. A lease still held ends here, before
	// the script: the script may grant the lock to a waiter at once, and
	// the new holder's Acquire may return before this call's reply does.
	if expired := ls.expireDue(); expired != nil {
		defer alsoReport(&report, expired)
	}
	ls.mu.Lock()
	lostBefore := ls.err
	ls.mu.Unlock()
	ending := lostBefore == nil && ls.endReleasing()
	if lostBefore == nil && !ending {
		ls.mu.Lock()
		lostBefore = ls.err // its timer ended it since: as if before Release
		ls.mu.Unlock()
	}
	deleted, err := ls.locker.releaseLease(ctx, &ls.attempt)
	switch {
	case lostBefore != nil && !errors.Is(lostBefore, fence.ErrReleased):
		err = lostBefore // conclusive: the lease was lost before Release
	case err != nil:
		err = fmt.Errorf("redislock: release %q: %w", ls.attempt.name, err)
		ls.mu.Lock()
		ls.relTried = true
		ls.mu.Unlock()
		if ending {
			return ls.releasedAs(err, true), err
		}
		return ls.endUnfreed(), err
	case !deleted && !ls.triedRelease():
		err = fmt.Errorf("%w: %q was removed or taken by another owner", fence.ErrLeaseLost, ls.attempt.name)
	}
	switch {
	case ending:
		report = ls.releasedAs(err, false)
	case err == nil:
		report = ls.end(fence.ErrReleased)
	default:
		report = ls.end(err)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if !ls.released {
		ls.released, ls.relErr = true, err
	}
	return report, ls.relErr
}
