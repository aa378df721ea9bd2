package redlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/atomictime"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/fencekit/fence/internal/releasectx"
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

	// The nodes whose grant of the acquisition has not come (it may still
	// run there, so Release revokes it with revokeKey), under mu: a grant
	// that comes after Acquire returned joins the lease (try.reply).
	ungranted []bool
	revokeKey string
	// try is the acquisition's fan-out, whose late replies are still read.
	try *tryFanout

	parent context.Context // the Acquire's context, for the values of ctx

	// relOp runs one Release at a time (a token in it is held): two at
	// once each deleted the lock on some nodes and found it gone on the
	// others, and both reported the lease lost. A Release waits for it
	// only as long as its ctx lasts: one in flight with a farther
	// deadline, waiting for hung nodes, does not hold up another given
	// a shorter one.
	relOp chan struct{}
	// relPrev is the last Release's fan-out when it concluded nothing
	// (under relOp): its requests go on in the background, and a retry
	// counts their replies rather than finding the lock gone where they
	// deleted it.
	relPrev *relFanout

	mu sync.Mutex
	// ctx is cancelled with the lease's Err as cause when it ends. It is
	// made on the first call of Done or Context (most holders call
	// neither), and at once for a watchdog lease; nil until then.
	ctx    context.Context
	cancel context.CancelCauseFunc

	deadline time.Time
	dl       atomictime.Time // deadline's copy for Deadline, which never blocks
	// Each node's clock read by its last reply to an acquire or extend
	// script, with the local time of that reply (zero: none yet). The
	// script ran before the reply came, so at local time t the node's
	// clock reads at least nodeMs + (t − at), give or take the clocks'
	// rates: this maps the deadline to each node's clock, whatever the
	// offsets between the clocks, for extend.lua to refuse late renewals.
	refs []clockRef
	// expiry ends the lease at its deadline. It is started with ctx (a
	// holder that calls neither Done nor Context cannot see the lease end
	// but through Err, which checks the deadline itself: see expiredLocked),
	// and at once when the Locker has an Observer, to be told on time.
	expiry   *time.Timer
	expCause fence.LeaseCause // the cause the deadline ends the lease with
	err      error            // why the lease ended; nil while held
	released bool             // Release reached a conclusion, kept in relErr
	relErr   error
	granted  time.Time // when the lease started, for the hold time

	// releasing is set by Release before it sends its deletes: a renewal
	// that finds the lock gone from then on may have been overtaken by
	// them, and leaves the verdict to Release.
	releasing bool
	// unreported: the lease was never granted (Close overtook its
	// acquisition, which released it and failed): its end is told to
	// neither the Observer nor the Logger.
	unreported bool
	// granting: the acquisition has started the lease and not yet listed
	// it for Close (it may still find that Close overtook it, and the
	// lease then was never granted): the report of an end meanwhile (a
	// deadline passed at the start, on a busy machine, fires the expiry
	// timer at once) is held in pending, for the acquisition to make once
	// it knows the lease granted, or to drop (unreported).
	granting bool
	pending  func()

	stopWatchdog context.CancelFunc // nil for fixed-TTL leases
	watchdogDone chan struct{}
	// logging: the watchdog is logging a failed renewal, with no renewal
	// of its under way, and renews no more if stopped meanwhile (see
	// logFailed): Release does not wait for it, as the Logger's handler
	// may be what calls Release.
	logging bool

	// ahead lists the nodes (nil: none) where a renewal that did not move
	// the deadline (it reached no majority in time) moved the lock, or
	// may have (its reply did not come): the lock there may outlive the
	// deadline by up to that renewal's TTL, even after a later renewal
	// moved the deadline (with a shorter TTL). Unless the lease is
	// released (Release deletes it everywhere), it is given back there
	// when the lease ends (endLocked).
	ahead []bool

	// renewing is held (one slot) by the renewal under way: the
	// watchdog's and the holder's Extend, or two Extends, take turns. Two
	// at once each read the deadline the other moved: an older renewal
	// refused as late under the deadline it was sent with ended the lease
	// and gave back its nodes while the newer one's Deadline said held,
	// and an older reply read last set the deadline from its own TTL.
	renewing chan struct{}
}

var _ fence.Lease = (*lease)(nil)

// clockRef is a node's clock, in ms, as a reply read it, and the local time
// the reply came.
type clockRef struct {
	nodeMs int64
	at     time.Time
}

// nodeDeadline is the lease's deadline on the clock of the node that ref
// read, erring early by the 1% the drift allowance grants the clocks'
// rates and a millisecond of rounding, or 0 when there is no reference:
// extend.lua then moves nothing. A renewal run on the node after it is
// refused; one run just before it too, and its reply would come too late
// to be of use anyway.
func nodeDeadline(deadline time.Time, ref clockRef) int64 {
	if ref.at.IsZero() {
		return 0
	}
	left := deadline.Sub(ref.at)
	return ref.nodeMs + (left - left/100).Milliseconds() - 1
}

// start sets the lease's deadline from sent, when the acquisition was sent,
// and, for a watchdog lease, starts its watchdog. The lease's context and
// expiry timer are made when first needed (arm).
func (ls *lease) start(ctx context.Context, watchdog bool, sent time.Time) {
	ttl := ls.ttl
	ls.parent = ctx
	ls.setDeadline(sent.Add(ttl - drift(ttl)))
	ls.granted = time.Now()
	ls.mu.Lock() // the timer may fire before ls.expiry is set
	defer ls.mu.Unlock()
	ls.granting = true // until the acquisition lists it (see listed)
	ls.expCause = fence.LostExpired
	if watchdog {
		ls.expCause = fence.LostRenewFailed // the watchdog's renewals failed until the deadline
	}
	if watchdog || ls.locker.obs != nil || ls.locker.log != nil {
		// The Observer and the Logger are told of an expiry when it
		// happens, by the timer: started first, so that a deadline that
		// passed before this (a busy machine between the try's validity
		// check and here) is ended by it, and reported
		// (TestExpiredAtGrantIsReported).
		ls.startExpiryLocked()
		_ = ls.armLocked() // a no-op: granting holds the report of an end (see listed)
	}
	if watchdog {
		var wdCtx context.Context
		wdCtx, ls.stopWatchdog = context.WithCancel(ls.ctx)
		ls.watchdogDone = make(chan struct{})
		go ls.keepRenewed(wdCtx)
	}
}

func (ls *lease) Name() string        { return ls.name }
func (ls *lease) Token() fence.Token  { return ls.token }
func (ls *lease) Deadline() time.Time { return ls.dl.Load() }

// setDeadline sets the deadline, under ls.mu, and the copy that Deadline
// reads without it.
func (ls *lease) setDeadline(d time.Time) { ls.deadline = d; ls.dl.Store(d) }
func (ls *lease) Done() <-chan struct{}   { return ls.Context().Done() }

func (ls *lease) Context() context.Context {
	ls.mu.Lock()
	report := ls.armLocked()
	ctx := ls.ctx
	ls.mu.Unlock()
	report()
	return ctx
}

func (ls *lease) Err() error {
	ls.mu.Lock()
	report := ls.dueLocked()
	err := ls.err
	ls.mu.Unlock()
	report()
	return err
}

// errQuiet is Err for the lease's own renewals, which hold what a callback
// may wait for (the renewing slot, the watchdog's goroutine): it ends the
// lease only as expiredLocked does, which reports nothing (a lease with an
// Observer or a Logger has a timer, which ends and reports it).
func (ls *lease) errQuiet() error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.expiredLocked()
	return ls.err
}

// armLocked makes the lease's context, cancelled at once if the lease has
// ended, and starts its expiry timer if it has not. It returns the report
// of an end (see dueLocked). ls.mu is held.
func (ls *lease) armLocked() (report func()) {
	report = ls.dueLocked() // past the deadline: Done is closed as it is handed out
	if ls.ctx == nil {
		ls.ctx, ls.cancel = context.WithCancelCause(context.WithoutCancel(ls.parent))
		if ls.err != nil {
			ls.cancel(ls.err)
		}
	}
	ls.startExpiryLocked()
	return report
}

// startExpiryLocked starts the lease's expiry timer, unless there is one or
// the lease has ended. A deadline already past fires it at once, and the
// timer ends the lease and reports it (expiredLocked, which ends a lease
// that has no timer, reports nothing). ls.mu is held.
func (ls *lease) startExpiryLocked() {
	if ls.expiry == nil && ls.err == nil {
		cause, name := ls.expCause, ls.name
		ls.expiry = time.AfterFunc(time.Until(ls.deadline), func() {
			ls.mu.Lock()
			moved := time.Now().Before(ls.deadline)
			ls.mu.Unlock()
			if moved {
				// A renewal moved the deadline (and reset this
				// timer) as the timer fired: the lease is held.
				return
			}
			if f := ls.locker.expiryFired; f != nil {
				f()
			}
			ls.endWhen(cause, expiredError(name), true)()
		})
	}
}

// expiredLocked ends the lease if its deadline has passed and no expiry
// timer is there to end it (it is made with the context, or with an
// Observer, which is then told by the timer). ls.mu is held.
func (ls *lease) expiredLocked() {
	if ls.err == nil && ls.expiry == nil && !time.Now().Before(ls.deadline) {
		ls.endLocked(expiredError(ls.name))
	}
}

// dueLocked ends the lease if its deadline has passed, as its expiry timer
// does, whether or not there is one and it has run: Err, Context and
// Release must not answer "held" in the gap before the timer's goroutine
// runs (an Observer or a Logger, which give every lease a timer, would
// otherwise change their answers:
// TestObservedLeaseEndsAtDeadlineBeforeItsTimer). It returns the report of
// the end (never nil), to be made once ls.mu is released. ls.mu is held.
func (ls *lease) dueLocked() (report func()) {
	if ls.err != nil || time.Now().Before(ls.deadline) {
		return func() {}
	}
	why := expiredError(ls.name)
	ls.endLocked(why)
	return ls.reportLocked(ls.expCause, why)
}

// expiredError is the Err of a lease whose deadline passed.
func expiredError(name string) error {
	return fmt.Errorf("%w: %q was not renewed on a majority before its deadline", fence.ErrLeaseLost, name)
}
func (ls *lease) String() string { return fmt.Sprintf("redlock lease %q token %d", ls.name, ls.token) }

// endAs records why the lease ended and cancels its context; the first
// call wins. It returns the report of the end, with cause, to the Observer
// and the Logger; see endWhen. (Release ends the lease otherwise: see
// endReleasingLocked.)
func (ls *lease) endAs(cause fence.LeaseCause, why error) (report func()) {
	return ls.endWhen(cause, why, false)
}

// endWhen is endAs; with expiring (the expiry timer's end), it ends the
// lease only if its deadline has passed, checked as it ends it: a renewal
// may have moved the deadline since the timer fired, and returned nil.
//
// The report it returns (never nil; a no-op when this call did not end the
// lease, or nobody is to be told) tells the Observer and the Logger, whose
// callbacks may call the lease's Release and Extend: the caller makes it
// once it holds nothing those wait for (relOp, the renewing slot, the
// watchdog's goroutine that Release waits to end).
func (ls *lease) endWhen(cause fence.LeaseCause, why error, expiring bool) (report func()) {
	ls.mu.Lock()
	if ls.err != nil || expiring && time.Now().Before(ls.deadline) {
		ls.mu.Unlock()
		return func() {}
	}
	ls.endLocked(why)
	report = ls.reportLocked(cause, why)
	ls.mu.Unlock()
	return report
}

// reportLocked returns the report of the lease's end, cause and why, to
// the Observer and the Logger (a no-op when nobody is to be told); see
// endWhen. ls.mu is held.
func (ls *lease) reportLocked(cause fence.LeaseCause, why error) (report func()) {
	l := ls.locker
	if ls.unreported || l.log == nil && l.obs == nil {
		return func() {}
	}
	ctx := ls.ctx
	if ctx == nil {
		ctx = ls.parent
	}
	ev := fence.LeaseEvent{Backend: backend, Name: ls.name, Token: ls.token, Cause: cause, Held: time.Since(ls.granted), Err: why}
	report = func() { fence.ReportLeaseEnded(ctx, l.obs, l.log, "redlock", ev) }
	if ls.granting {
		// Held until the acquisition knows whether the lease was
		// granted (see listed).
		ls.pending = report
		return func() {}
	}
	return report
}

// listed ends the acquisition's hold on the report of the lease's end
// (see granting), once it has listed the lease for Close (ok) or found
// that Close overtook it (the lease was never granted: its end is never
// reported). It returns the report of an end that came meanwhile (never
// nil), for the acquisition to make.
func (ls *lease) listed(ok bool) (report func()) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	report = ls.pending
	ls.granting, ls.pending = false, nil
	if !ok {
		ls.unreported = true
	}
	if !ok || report == nil {
		return func() {}
	}
	return report
}

// endReleasingLocked ends the lease as Release is about to send its first
// delete: once a majority has run it, another Acquire may take the lock,
// and by then this lease's Err, Done and Context must say it is over (a
// goroutine of the holder's still working under Context would otherwise
// write while the next holder holds the lock). It ends as released: Err is
// fence.ErrReleased, the Context is cancelled with it as cause and the
// expiry timer is stopped. Nothing is reported, and the lease stays on the
// Locker's list (Close, finding it there, waits for this Release):
// releasedAs does both once the replies tell whether the lock was still
// the lease's. Nothing is given back either: Release deletes the lock on
// every node. ls.mu is held, ls.err is nil and ls.releasing is set.
func (ls *lease) endReleasingLocked() {
	ls.err = fence.ErrReleased
	if ls.expiry != nil {
		ls.expiry.Stop()
	}
	if ls.cancel != nil {
		ls.cancel(fence.ErrReleased)
	}
}

// releasedAs settles the end of a lease that endReleasingLocked ended, by
// what its Release returns, and returns its report (see endWhen): a loss
// (the lock found gone on too many nodes for a majority to have deleted
// it) is reported as LostRemoved, and Err returns it from now on (the
// Context's cause stays fence.ErrReleased: it was cancelled as the release
// started); anything else, a success or an error that concluded nothing,
// as Released.
func (ls *lease) releasedAs(result error) (report func()) {
	ls.locker.bg.forget(ls)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if errors.Is(result, fence.ErrLeaseLost) && !errors.Is(result, fence.ErrReleased) {
		ls.err = result
		if now := time.Now(); ls.deadline.After(now) {
			// As endLocked does for a loss: no longer known to be
			// held.
			ls.setDeadline(now)
		}
		if errors.Is(result, errRanOut) {
			return ls.reportLocked(fence.LostExpired, result)
		}
		return ls.reportLocked(fence.LostRemoved, result)
	}
	return ls.reportLocked(fence.Released, fence.ErrReleased)
}

// endLocked records why the lease ended, stops its expiry timer and cancels
// its context, those that were made. ls.mu is held and ls.err is nil.
func (ls *lease) endLocked(why error) {
	ls.err = why
	if now := time.Now(); !errors.Is(why, fence.ErrReleased) && ls.deadline.After(now) {
		// Lost before its deadline (the lock found gone on too many
		// nodes, and given back on those that still had it): the lease
		// is no longer known to be held.
		ls.setDeadline(now)
	}
	l := ls.locker
	l.bg.forget(ls)
	if ls.expiry != nil {
		ls.expiry.Stop()
	}
	if !errors.Is(why, fence.ErrReleased) && !ls.releasing {
		// Not released: the nodes where a renewal that did not move the
		// deadline moved the lock would keep it past the deadline. Given
		// back in the background, which Close waits for. (A Release
		// under way deletes it on every node: a give-back racing its
		// deletes would make them find the lock gone, and the lease
		// reported lost.)
		// A lease whose acquisition may have been sent twice (resent)
		// is given back on every node, with the revocation mark: the
		// first copy, still on its way, would otherwise take the lock
		// again once it has run out here, for its lease time, for
		// nobody (TestDelayedAcquisitionCopyAfterExpiry).
		resent := ls.try.resent.Load()
		for i := range l.nodes {
			if !resent && (ls.ahead == nil || !ls.ahead[i]) {
				continue
			}
			l.bg.add(i)
			l.spawn(func() {
				defer l.bg.done(i)
				ctx, cancel := context.WithTimeout(context.Background(), l.timeoutFor(ls.ttl))
				defer cancel()
				keys, args := ls.try.relKeys()
				_ = releaseScript.Run(ctx, l.nodes[i], keys, args...).Err()
			})
		}
		ls.ahead = nil
	}
	if ls.cancel != nil {
		ls.cancel(why)
	}
}

// keepRenewed is the watchdog: it renews the lease every third of its TTL
// until the lease ends or Release stops it. A failed renewal is retried
// sooner; the expiry timer ends the lease if no renewal reaches a majority
// before the deadline.
//
// A renewal that finds the lease lost reports it once the watchdog is done
// (watchdogDone closed): the Observer or the Logger told may call Release,
// which waits for the watchdog to be done.
func (ls *lease) keepRenewed(ctx context.Context) {
	report := ls.renewLoop(ctx)
	close(ls.watchdogDone)
	report()
}

// renewLoop is keepRenewed's loop; it returns the report of the lease's
// end when a renewal found it lost.
func (ls *lease) renewLoop(ctx context.Context) (report func()) {
	every := ls.ttl / 3
	timer := time.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return func() {}
		case <-timer.C:
		}
		rctx, cancel := context.WithDeadline(ctx, ls.Deadline())
		report, err := ls.renew(rctx, ls.ttl)
		cancel()
		switch {
		case errors.Is(err, fence.ErrLeaseLost):
			return report
		case err != nil:
			if !ls.logFailed(ctx, err) {
				return func() {} // stopped while it logged
			}
			if errors.Is(err, fence.ErrClosed) {
				// Nothing will renew it: it ends now, not at its
				// deadline (the watchdog TTL, 30 s by default, for a fn
				// that could not be told), with an error that fence.Lead
				// stops on.
				return ls.endAs(fence.LostRenewFailed, fmt.Errorf("%w: %q: nothing can renew it: %w", fence.ErrLeaseLost, ls.name, err))
			}
			timer.Reset(every / 4)
		default:
			timer.Reset(every)
		}
	}
}

// logFailed logs a failed renewal of the watchdog's, marked as logging,
// and reports whether the watchdog may go on (false: Release stopped it
// meanwhile). The handler may call Release, which stops the watchdog and
// would wait for it to return, that is for the handler: a deadlock. Release
// does not wait for a watchdog marked logging, and that is safe: what
// Release waits for is a renewal of the watchdog's in flight, which could
// move locks that Release deletes or end the lease as lost, and there is
// none: this renewal has returned (and given back the renewing slot), and
// the watchdog starts no other once it has seen, under ls.mu here, that it
// was stopped (Release stops it before it reads logging under ls.mu, so a
// Release that did not wait is seen). The watchdog then returns on its
// own, once the handler has. Conversely a watchdog that finds itself
// stopped before it logs does not log: a Release may be waiting for it,
// holding relOp, which a handler's Release would wait for (and a renewal
// cut short by Release is no failure).
func (ls *lease) logFailed(ctx context.Context, err error) bool {
	log := ls.locker.log
	if log == nil {
		return true
	}
	ls.mu.Lock()
	if ctx.Err() != nil {
		// Stopped: a renewal that Release cut short is no failure, and a
		// Release that read logging false waits for this goroutine.
		ls.mu.Unlock()
		return false
	}
	ls.logging = true
	ls.mu.Unlock()
	if ls.errQuiet() == nil {
		log.LogAttrs(ctx, slog.LevelWarn, "redlock: renewal failed",
			slog.String("name", ls.name), slog.Int64("token", int64(ls.token)),
			slog.Time("deadline", ls.Deadline()), slog.Any("error", err))
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.logging = false
	return ctx.Err() == nil
}

// renew moves the expiry on every node that still holds the lease. When a
// majority did so in time, it moves the deadline; when too few nodes still
// hold the lease for a majority to be possible, the lease is lost. Each
// node is told the lease's deadline on its own clock and refuses the
// renewal after it (a refusal counts as the lock gone there once the
// deadline has passed here too; before, as a node that did not move it);
// a node whose clock the lease has not read yet (it did not answer the
// acquisition in time) moves nothing this time and tells its clock for the
// next. One renewal runs at a time (the watchdog's and Extend take turns),
// each waiting for its turn until ctx ends. The report it returns (never
// nil) tells of the lease's end when this renewal ended it: the caller
// makes it once out of the renewing slot (see endWhen).
func (ls *lease) renew(ctx context.Context, ttl time.Duration) (report func(), err error) {
	report = func() {}
	select {
	case ls.renewing <- struct{}{}:
	case <-ctx.Done():
		return report, fmt.Errorf("redlock: extend %q: %w", ls.name, ctx.Err())
	}
	defer func() { <-ls.renewing }()
	// Counted before the lease's end is checked: a Close that found the
	// lease ended (and so released nothing of it) either waits for this
	// renewal, or came before it, which then finds the lease ended too
	// and sends nothing.
	ls.locker.bg.busy()
	defer ls.locker.bg.leave()
	if err := ls.errQuiet(); err != nil {
		return report, ls.endedErr(err) // ended while this renewal waited its turn
	}
	l := ls.locker
	ls.mu.Lock()
	deadlines := make([]int64, len(l.nodes))
	for i, ref := range ls.refs {
		deadlines[i] = nodeDeadline(ls.deadline, ref)
	}
	ls.mu.Unlock()
	sent := time.Now()
	rs := l.fanout(ctx, l.all(), l.timeoutFor(ttl), func(ctx context.Context, i int) ([]int64, error) {
		return extendScript.Run(ctx, l.nodes[i], []string{ls.keys.lock}, ls.owner, ttl.Milliseconds(), deadlines[i]).Int64Slice()
	})
	var (
		moved, gone, late int
		closed            int // nodes whose client the user closed
		movedOn, unknown  []int
		errs              []error
	)
	ls.mu.Lock()
	// A refusal as late is the lock gone there only once the deadline has
	// passed here as well. The deadline mapped to the node's clock errs
	// early by how long the reply that read that clock took to be read (on
	// a loaded machine, tens of milliseconds): refused before the
	// deadline, the renewal merely did not move the lock there, which the
	// node keeps until it runs out, at the deadline or later. Counted as
	// gone, it ended the lease and gave back the nodes that this renewal
	// had moved while Deadline still said held: the lock was left on too
	// few nodes before the deadline, and another Locker took it.
	pastDeadline := !time.Now().Before(ls.deadline)
	for i, r := range rs {
		if r.err != nil || len(r.res) != 2 {
			errs = append(errs, cmp.Or(r.err, fmt.Errorf("node %d: unexpected reply %v", i, r.res)))
			unknown = append(unknown, i)
			if errors.Is(r.err, redis.ErrClosed) {
				closed++
			}
			continue
		}
		ls.refs[i] = clockRef{nodeMs: r.res[1], at: r.at}
		switch {
		case r.res[0] == 1:
			moved++
			movedOn = append(movedOn, i)
		case r.res[0] == 0:
			gone++
		case deadlines[i] != 0 && pastDeadline:
			// Run after the lease's deadline on this node's clock, and
			// the deadline has passed: the lock there runs out when it
			// would have.
			gone++
			late++
		case deadlines[i] != 0:
			errs = append(errs, fmt.Errorf("node %d: %w", i, errRenewLate))
		}
	}
	ls.mu.Unlock()
	if len(l.nodes)-gone < l.quorum {
		ls.mu.Lock()
		releasing := ls.releasing
		ls.mu.Unlock()
		if releasing {
			// Release's deletes may be what it found: Release says
			// whether the lease was lost, and ends it.
			return report, releasedErr(ls.name)
		}
		lost := fmt.Errorf("%w: %q was removed or taken by another owner on %d of %d nodes", fence.ErrLeaseLost, ls.name, gone-late, len(l.nodes))
		if late > 0 {
			lost = fmt.Errorf("%w, and %d renewals reached their node after the lease's deadline", lost, late)
		}
		cause := fence.LostRemoved
		if late == gone {
			cause = fence.LostRenewLate
		}
		report = ls.endAs(cause, lost)
		ls.giveBack(ctx, movedOn)
		return report, lost
	}
	newDeadline := sent.Add(ttl - drift(ttl))
	if moved < l.quorum || !time.Now().Before(newDeadline) {
		ls.aheadOn(ctx, append(movedOn, unknown...))
		why := fmt.Errorf("%w: extended on %d of %d nodes, %d needed", ErrNoQuorum, moved, len(l.nodes), l.quorum)
		if len(l.nodes)-closed < l.quorum {
			// No majority is left, as Acquire says: nothing can renew
			// the lease (the watchdog ends it, see renewLoop).
			why = fmt.Errorf("%w: the clients of %d of %d nodes were closed (%w)", ErrNoQuorum, closed, len(l.nodes), fence.ErrClosed)
		}
		err := fmt.Errorf("redlock: extend %q: %w", ls.name, errors.Join(append([]error{why}, errs...)...))
		if ended := ls.errQuiet(); ended != nil {
			// The lease ended (its deadline passed) while the renewal
			// was out: that is the answer, as for an Extend called
			// after it; the renewal's failure says why.
			return report, fmt.Errorf("%w (%w)", ls.endedErr(ended), err)
		}
		return report, err
	}
	// Moved on a majority, each node in time by its clock (extend.lua
	// refuses a late renewal): the lock was held throughout, and the
	// lease goes on with the new deadline, even if the old one passed
	// while the replies were on their way, unless something ended it
	// meanwhile (its timer, or Err, Context, Release or Extend, which end
	// a lease past its deadline: once told, the lease stays ended). So
	// with or without a timer (an Observer, a Logger, a call of Done), the
	// same replies give the same answer
	// (TestRenewalReadPastDeadlineKeepsLease).
	ls.mu.Lock()
	if err := ls.err; err != nil {
		// The lease ended (its deadline passed, or Release started)
		// while the renewal was on its way: nobody will use the locks it
		// moved.
		ls.mu.Unlock()
		ls.giveBack(ctx, movedOn)
		return report, ls.endedErr(err)
	}
	defer ls.mu.Unlock()
	// ls.ahead is left as it is: a node that this renewal moved may still
	// hold the lock past the new deadline, for the longer TTL of the
	// renewal that put it ahead (extend.lua only moves an expiry later,
	// and answers moved when it leaves a later one).
	ls.setDeadline(newDeadline)
	if ls.expiry != nil {
		ls.expiry.Reset(time.Until(newDeadline))
	}
	return report, nil
}

// errRenewLate is the error of a node that refused a renewal as run past
// the lease's deadline mapped to its clock, when the deadline had not
// passed yet by the holder's: the lock there was not moved, and runs out
// when it would have.
var errRenewLate = errors.New("renewal refused as past the lease's deadline on the node's clock")

// aheadOn records that a renewal which did not move the deadline moved the
// lock, or may have, on the nodes listed: they are given back when the
// lease ends, at once if it has ended already (a renewal that ran before
// the deadline, read after it).
func (ls *lease) aheadOn(ctx context.Context, nodes []int) {
	if len(nodes) == 0 {
		return
	}
	ls.mu.Lock()
	ls.expiredLocked()
	if ls.err != nil {
		ls.mu.Unlock()
		ls.giveBack(ctx, nodes)
		return
	}
	if ls.ahead == nil {
		ls.ahead = make([]bool, len(ls.locker.nodes))
	}
	for _, i := range nodes {
		ls.ahead[i] = true
	}
	ls.mu.Unlock()
}

// giveBack deletes the lock, if this lease still owns it, on the nodes
// listed, each within the node timeout, whatever the lease's context: a
// renewal moved it there after the lease had ended, or too late to keep it.
// The deletes are background work (Close waits for them); the caller, the
// renewal of an Extend or of the watchdog, waits for them until ctx ends,
// so that nodes that hang as the renewal's replies come do not hold an
// Extend a node timeout past its caller's deadline
// (TestExtendGiveBackHungWithinDeadline).
func (ls *lease) giveBack(ctx context.Context, nodes []int) {
	ls.mu.Lock()
	releasing := ls.releasing
	ls.mu.Unlock()
	if len(nodes) == 0 || releasing {
		// Release's deletes, sent to every node, give it back: this
		// one, racing them, would make them find the lock gone.
		return
	}
	l := ls.locker
	keys, args := ls.try.relKeys()
	l.releaseBehind(ctx, nodes, l.timeoutFor(ls.ttl), keys, args, nil)
}

// Extend sets the lease to expire ttl from now on a majority of the nodes;
// see fence.Lease. A watchdog lease goes on being renewed with its watchdog
// TTL afterwards, at its next renewal as scheduled: a ttl that ends before
// that renewal ends the lease at its new Deadline. From the moment Release (or Close) starts to release the
// lease, Extend returns an error matching both fence.ErrLeaseLost and
// fence.ErrReleased, as after it (the lease is no longer the caller's), and
// leaves it to Release to say whether the lease was lost: a renewal in
// flight that finds the lock gone may have found Release's own deletes; an
// Extend called while that Release is under way contacts no node.
func (ls *lease) Extend(ctx context.Context, ttl time.Duration) error {
	if ctx == nil {
		return nilctx.Err("redlock", "Extend")
	}
	if err := fence.ValidateTTL(ttl); err != nil {
		return err
	}
	// Past the deadline, the lease ends here, as Err would, whether or
	// not its timer has run: sent, the renewal would be refused as late
	// and the lease reported lost as LostRenewLate. Reported here: Extend
	// holds nothing yet that a callback waits for.
	ls.mu.Lock()
	report := ls.dueLocked()
	err := ls.err
	ls.mu.Unlock()
	report()
	switch {
	case err == fence.ErrReleased:
		// Released, or a Release under way ended the lease before its
		// deletes were sent (it says whether the lease was lost).
		return releasedErr(ls.name)
	case err != nil:
		return err
	}
	report, err = ls.renew(ctx, ttl)
	report()
	return err
}

// Release deletes the lock on every node where this lease still owns it;
// see fence.Lease. It returns nil when a majority deleted it, an error
// matching fence.ErrLeaseLost when too few nodes still held it for a
// majority, and otherwise the nodes' errors (call again to retry). A retry
// counts the lock found gone on a node where the last call's delete failed
// or had not answered as deleted: that delete, or its background retry, may
// have run there.
//
// The lease ends as the release starts, whatever the nodes answer: before
// the first delete is sent, Err returns fence.ErrReleased, Done is closed
// and Context is cancelled with that cause, since once a majority has
// deleted the lock another Acquire may take it while this call still waits
// for the replies. If that call's replies then show the lease lost (it
// returns an error matching fence.ErrLeaseLost), Err returns that error
// from then on, and the end is reported as LostRemoved rather than
// Released; a retry after a call that concluded nothing changes neither.
//
// Release returns as soon as its outcome is known, not when the slowest
// node has answered: once a majority has deleted the lock, or once so many
// nodes found it gone that a majority can no longer have deleted it. The
// other nodes' releases go on in the background, each within the node
// timeout; on a node that does not answer, the release is retried in the
// background within the lease time. So it is on a node that refuses the
// connection, until the Locker's Close: a node restarting from its AOF
// would otherwise come back with the released lock for the rest of the
// lease time (TestReleaseOnRestartingPersistentNode).
//
// The end of the lease is reported to the Observer and the Logger once
// Release has concluded and lets another call in: a callback may call
// Release again, which returns this call's result.
func (ls *lease) Release(ctx context.Context) error {
	if ctx == nil {
		return nilctx.Err("redlock", "Release")
	}
	report, err := ls.release(ctx)
	report()
	return err
}

// release is Release, but for the report of the lease's end, which it
// returns (never nil).
func (ls *lease) release(ctx context.Context) (report func(), err error) {
	ls.mu.Lock()
	watched := ls.ctx != nil
	ls.mu.Unlock()
	if watched {
		// Bounded by the deadline as the lease ends, not as this call
		// starts: the watchdog's renewal that it waits for below may
		// move it (even one read past the old deadline: see renew).
		// The lease ends before the deletes are sent: a ctx that its
		// end cancels (its Context, or fence.Run's fn's) must not cut
		// this call short; it ends at the lease's deadline instead, as
		// the lease's expiry ended it before. Only a lease whose
		// context was made can have one. Detached before waiting for a
		// Release in flight too: that one's end of the lease must not
		// make this call give up waiting for its result.
		var stop func()
		ctx, stop = releasectx.DetachBy(ctx, ls.Deadline)
		defer stop()
	}
	select {
	case ls.relOp <- struct{}{}:
	default:
		select {
		case ls.relOp <- struct{}{}:
		case <-ctx.Done():
			// The Release in flight ends the lease; this one concluded
			// nothing, and calling Release again waits for that one.
			return func() {}, fmt.Errorf("redlock: release %q: %w", ls.name, ctx.Err())
		}
	}
	defer func() { <-ls.relOp }()
	ls.mu.Lock()
	if ls.released {
		defer ls.mu.Unlock()
		return func() {}, ls.relErr
	}
	ls.mu.Unlock()
	// ending: this call ends the lease (before its first delete leaves),
	// and settles what is reported of the end once the result is known.
	var ending bool
	defer func() {
		if ending {
			report = ls.releasedAs(err)
		}
	}()
	if ls.stopWatchdog != nil {
		// Past the deadline, the lease ends here, as Err would, before
		// Release waits for the watchdog's renewal in flight, which,
		// run in time but read late, would keep it (see renew); below,
		// it then counts as lost before Release.
		ls.mu.Lock()
		if ls.err == nil && !time.Now().Before(ls.deadline) {
			ls.releasing = true // not given back: Release's deletes cover every node
			expired := ls.dueLocked()
			defer func() { report = expired }() // every other report of this call is a no-op
		}
		ls.mu.Unlock()
		ls.stopWatchdog()
		ls.mu.Lock()
		logging := ls.logging // renewing no more: see logFailed
		ls.mu.Unlock()
		if !logging {
			<-ls.watchdogDone
		}
	}
	// Lost before Release, not while it waits for a slow node: the holder
	// stopped using the lease when it called Release.
	// Read with releasing set, at once: a lease that ends from now on is
	// not given back at its end (endLocked), Release's deletes covering
	// every node; a give-back racing them made them find the lock gone,
	// and Release report the lease lost to another owner.
	//
	// A lease still held ends here, before the first delete is sent: see
	// endReleasingLocked. A grant of the acquisition read from now on
	// finds it ended and is given back (join refuses it), so the nodes
	// whose grant has not come, read with it, stay as they are.
	ls.mu.Lock()
	ls.releasing = true
	held := ls.err == nil
	if expired := ls.dueLocked(); held && ls.err != nil {
		// Ended here by its deadline, as Err would (with releasing
		// set: not given back, Release's deletes covering every node).
		// Reported as this call returns (reported here, a callback's
		// Release would wait for this one); every other report of
		// this call is a no-op.
		defer func() { report = expired }()
	}
	lostBefore := ls.err
	if lostBefore == nil {
		ls.endReleasingLocked()
		ending = true
	}
	l := ls.locker
	// The same keys and arguments for every node, the acquisition's (with
	// the revocation mark if a request of it may have been sent twice: a
	// copy still on its way is refused when it runs); the nodes whose
	// grant has not come get the revocation mark too: if the acquisition
	// has not run there yet, it refuses when it does.
	relKeys, relArgs := ls.try.relKeys()
	var revKeys []string
	var revArgs []any
	var ungranted []bool // nil: none
	if slices.Contains(ls.ungranted, true) {
		ungranted = slices.Clone(ls.ungranted)
	}
	ls.mu.Unlock()
	if ungranted != nil {
		revKeys = []string{ls.keys.lock, ls.revokeKey, ls.keys.token}
		revArgs = []any{ls.owner, max(ls.ttl, revokeFor).Milliseconds(), int64(ls.token)}
	}
	n, q := len(l.nodes), l.quorum
	timeout := l.timeoutFor(ls.ttl)
	f := &relFanout{rs: make([]result, n), left: n, wake: make(chan struct{})}
	if prev := ls.relPrev; prev != nil {
		// A retry: the last call's requests may still be out. Its
		// replies count; only the nodes that failed are asked again.
		select {
		case <-prev.wake:
		case <-ctx.Done():
			deleted, gone, rs := prev.seen(ctx, timeout)
			switch {
			case deleted >= q:
			case n-gone < q:
				err = fmt.Errorf("%w: %q was removed or taken by another owner on %d of %d nodes", fence.ErrLeaseLost, ls.name, gone, n)
			case !time.Now().Before(ls.Deadline()):
				// The lease time ran out while the last call's deletes
				// were out: the lease is over, as below.
				err = fmt.Errorf("%w: %q: %w (%v)", fence.ErrLeaseLost, ls.name, errRanOut, ls.noQuorum(rs, prev))
			default:
				return func() {}, ls.noQuorum(rs, prev)
			}
			ls.mu.Lock()
			defer ls.mu.Unlock()
			if !ls.released {
				ls.released, ls.relErr = true, err
			}
			return func() {}, ls.relErr
		}
		prev.mu.Lock()
		f.ours = make([]bool, n)
		for i, r := range prev.rs {
			if r.got && r.err == nil {
				f.rs[i] = r
				f.left--
			} else {
				// Its delete, or the background retry of it, may
				// have run there: the lock found gone is no sign
				// that the lease was lost.
				f.ours[i] = true
			}
		}
		f.deleted, f.gone = prev.deleted, prev.gone
		prev.mu.Unlock()
	}
	// A node whose grant has not come is sent the revocation: its 0 (the
	// lock not there) frees the node as a delete does, since the
	// acquisition, if it runs there after all, is refused. It is no sign
	// that the lease was lost.
	// Its -1, another owner holds the lock there, frees nothing: the
	// lease's lock is not there, whether the acquisition never ran, was
	// refused, or ran and was lost to that owner.
	if ungranted != nil {
		f.revoked = ungranted
	}
	// The requests do not end with ctx: one still out when Release
	// returns is answered in the background, within the node timeout.
	var rctx context.Context
	rctx, f.cancel = context.WithTimeout(context.WithoutCancel(ctx), timeout)
	decided := f.left == 0 || f.deleted >= q || n-f.gone < q
	if decided {
		f.woke = true // decided by the last call's late replies
		close(f.wake)
		f.cancel()
	}
	for i := range n {
		if decided || f.rs[i].got {
			// The last call's request deleted it, or found it gone;
			// or the outcome is known, and the last call's requests
			// still out (and the background retries of those that
			// failed) are left to finish.
			continue
		}
		l.bg.add(i)
		l.spawn(func() {
			defer l.bg.done(i)
			keys, args := relKeys, relArgs
			if ungranted != nil && ungranted[i] {
				keys, args = revKeys, revArgs
			}
			v, err := releaseScript.Run(rctx, l.nodes[i], keys, args...).Int64()
			// A node that did not answer may still hold the lock (or
			// run the acquisition late, if it never answered that
			// either) for the rest of the lease time: retry there in
			// the background, as for a failed try.
			if err != nil {
				l.retryRelease(err, i, ls.keys, ls.owner, ls.revokeKey, ls.ttl, int64(ls.token))
			}
			if f.reply(i, v, err, q) {
				f.cancel()
				// A grant of the acquisition read from now on is
				// given back by the request that brings it, if the
				// release did not reach its node. Where it did, it
				// covered the grant (sent with the revocation mark if
				// the grant had not come: the node refuses the
				// acquisition if it runs it after the release, and
				// the release deletes it if before). Until now, a late
				// grant found the lease ended and was given back.
				ls.try.release(f.final())
			}
		})
	}
	select {
	case <-f.wake:
	case <-rctx.Done():
	case <-ctx.Done():
	}
	deleted, gone, rs := f.seen(ctx, timeout)
	// Deciding before every node answered changes no answer: deleted and
	// gone only grow as replies come, and deleted+gone never exceeds n. So
	// once deleted >= q, n−gone >= q holds for good (the lease is never
	// reported lost afterwards), and once n−gone < q, deleted < q holds for
	// good: ErrLeaseLost is returned exactly when waiting for every reply
	// would have returned it, on the same replies, never on fewer (the
	// rule for "lost" is no looser). A node that has not answered counts
	// neither way, as a node that did not answer in time always did.
	switch {
	case lostBefore != nil && !errors.Is(lostBefore, fence.ErrReleased):
		err = lostBefore // conclusive: the lease was lost before Release
	case deleted >= q:
	case n-gone < q:
		err = fmt.Errorf("%w: %q was removed or taken by another owner on %d of %d nodes", fence.ErrLeaseLost, ls.name, gone, n)
	case !time.Now().Before(ls.Deadline()):
		// The lease time ran out while the deletes were out (a short
		// lease, or slow nodes): whatever the nodes answer, the lease
		// is over, as it is for a Release that starts after its
		// Deadline, and a retry could only find the lock gone. The
		// requests still out, and the background retries of those that
		// failed, go on deleting.
		err = fmt.Errorf("%w: %q: %w (%v)", fence.ErrLeaseLost, ls.name, errRanOut, ls.noQuorum(rs, f))
	default:
		return func() {}, ls.noQuorum(rs, f)
	}
	// The lease has ended: by this call (its report is settled by err, in
	// the deferred releasedAs), or before it.
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if !ls.released {
		ls.released, ls.relErr = true, err
	}
	return func() {}, ls.relErr
}

// errRanOut is in the error of a Release whose lease time ran out before a
// majority answered it: the lease is over (ErrLeaseLost), expired.
var errRanOut = errors.New("its lease time ran out before a majority answered the release")

// noQuorum returns the error of a Release that concluded nothing (see
// release; the lease has ended, released, before its deletes were sent);
// f's requests go on, and a retry counts their replies.
func (ls *lease) noQuorum(rs []result, f *relFanout) error {
	ls.relPrev = f
	f.mu.Lock()
	deleted := f.deleted
	f.mu.Unlock()
	var errs []error
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, r.err)
		}
	}
	n, q := len(ls.locker.nodes), ls.locker.quorum
	why := fmt.Errorf("%w: released on %d of %d nodes, %d needed", ErrNoQuorum, deleted, n, q)
	return fmt.Errorf("redlock: release %q: %w", ls.name, errors.Join(append([]error{why}, errs...)...))
}

// relFanout is one Release's requests, sent to every node at once, and
// their replies, the late ones too.
type relFanout struct {
	wake   chan struct{}      // closed once the outcome is known, or every node answered
	cancel context.CancelFunc // ends the requests' context; called by the last reply

	// ours lists the nodes where a reply that finds the lock gone counts
	// as deleted, not as a sign that the lease was lost (nil: none): on a
	// retry, those where an earlier call's request failed or had not
	// answered (it, or its background retry, may have deleted the lock
	// there).
	ours []bool
	// revoked lists the nodes sent the revocation, whose grant had not
	// come (nil: none): their 0 (the lock not there) counts as deleted,
	// their -1 (another owner's lock there) as gone.
	revoked []bool

	mu      sync.Mutex
	rs      []result // by node; got once its reply came
	left    int      // requests not answered yet
	deleted int      // replies that deleted the lock (or found it gone where ours)
	gone    int      // replies that found it gone (another owner's, or none)
	woke    bool
}

// reply records node i's reply to the release, wakes Release when it
// decides the outcome (a majority deleted the lock, or can no longer have),
// and tells whether it was the last reply.
func (f *relFanout) reply(i int, v int64, err error, q int) (last bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rs[i] = result{err: err, at: time.Now(), got: true}
	if err == nil {
		f.rs[i].res = oneReply(v)
		if v == 1 || f.ours != nil && f.ours[i] || v == 0 && f.revoked != nil && f.revoked[i] {
			f.deleted++
		} else {
			f.gone++
		}
	}
	f.left--
	if !f.woke && (f.deleted >= q || len(f.rs)-f.gone < q || f.left == 0) {
		f.woke = true
		close(f.wake)
	}
	return f.left == 0
}

// seen returns the counts of the replies come so far and the replies, by
// node, with the errors of those that have not come (ctx's, if it has
// ended, or errNoReply within timeout).
func (f *relFanout) seen(ctx context.Context, timeout time.Duration) (deleted, gone int, out []result) {
	f.mu.Lock()
	deleted, gone, out = f.deleted, f.gone, slices.Clone(f.rs)
	f.mu.Unlock()
	for i := range out {
		out[i].err = replyError(ctx, i, out[i], timeout)
	}
	return deleted, gone, out
}

// final returns every node's reply, once all have come.
func (f *relFanout) final() []result {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.rs)
}

// endedErr is a renewal's error for a lease that ended with err: err, or
// releasedErr when a Release ended it (fence.ErrReleased alone does not
// match fence.ErrLeaseLost, which Extend returns once the lease is over).
func (ls *lease) endedErr(err error) error {
	if err == fence.ErrReleased {
		return releasedErr(ls.name)
	}
	return err
}

// releasedErr is Extend's error for a lease that a Release ended.
func releasedErr(name string) error {
	return fmt.Errorf("%w: %q: %w", fence.ErrLeaseLost, name, fence.ErrReleased)
}
