package pglock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/atomictime"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/fencekit/fence/internal/pause"
	"github.com/fencekit/fence/internal/releasectx"
)

// lease is a lock row held in PostgreSQL. Its expiry timer ends it at the
// local deadline unless a renewal moved the deadline first; a watchdog lease
// has a goroutine that renews it every third of its TTL.
type lease struct {
	l     *Locker
	a     attempt
	token fence.Token

	ctx    context.Context // cancelled with the lease's Err as cause when it ends
	cancel context.CancelCauseFunc

	// op serializes renewals and the release: a token in it is held.
	// A call waits for it only as long as its ctx lasts (lockOp): a
	// renewal hung on the database must not hold up a Release or an
	// Extend given a shorter deadline.
	op chan struct{}

	mu       sync.Mutex
	deadline time.Time
	dl       atomictime.Time // deadline's copy for Deadline, which never blocks
	expiry   *time.Timer
	err      error // why the lease ended; nil while held
	released bool  // Release reached a conclusion, kept in relErr
	relErr   error
	// relTried: a Release failed: its statement may have committed all
	// the same (ctx ended while it ran, the connection broke), or it left
	// the row to be freed in the background (ahead). A later Release that
	// finds no row of its own cannot tell that delete from a loss, and
	// reports a release (fence.Lease's Release).
	relTried bool
	// concluded is closed once released is set (concludeLocked): a
	// Release waiting for ls.op returns that conclusion.
	concluded chan struct{}
	granted   time.Time // when the lease started, for the hold time
	// unreported reports the lease's end, until flush has (nil: not
	// ended, or reported).
	unreported func()

	watchdogDone chan struct{} // nil for fixed-TTL leases
	// logging: the watchdog is logging a failed renewal, with no renewal
	// under way, and renews no more once the lease ended (see logFailed):
	// Release does not wait for it, as the Logger's handler may be what
	// calls Release.
	logging bool

	// ahead: a renewal whose reply did not come (an error, a done ctx)
	// may have moved the row's expiry, and not the deadline: the row may
	// outlive the deadline by up to that renewal's TTL, held by nobody.
	// Unless Release frees it, it is freed when the lease ends (endAs).
	ahead bool
}

var _ fence.Lease = (*lease)(nil)

// deadline is when a lease of ttl requested at sent is known to be held:
// the database counts from later than sent, never earlier, and the two
// clocks may run at slightly different rates (1% plus 2 ms, as redislock).
func deadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - ttl/100 - 2*time.Millisecond)
}

func (l *Locker) newLease(ctx context.Context, a *attempt, token fence.Token, sent time.Time) *lease {
	ls := &lease{l: l, a: *a, token: token, granted: time.Now(), op: make(chan struct{}, 1), concluded: make(chan struct{})}
	ls.ctx, ls.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	ls.mu.Lock() // the timer may fire before ls.expiry is set
	defer ls.mu.Unlock()
	ls.setDeadline(deadline(sent, a.ttl))
	ls.expiry = time.AfterFunc(time.Until(ls.deadline), func() {
		ls.errQuiet() // ends the lease if its deadline has passed (a renewal may have moved it)
		ls.flush()
	})
	if a.watchdog {
		ls.watchdogDone = make(chan struct{})
		go ls.keepRenewed()
	}
	return ls
}

func (ls *lease) Name() string        { return ls.a.name }
func (ls *lease) Token() fence.Token  { return ls.token }
func (ls *lease) Deadline() time.Time { return ls.dl.Load() }

// setDeadline sets the deadline, under ls.mu, and the copy that Deadline
// reads without it.
func (ls *lease) setDeadline(d time.Time) { ls.deadline = d; ls.dl.Store(d) }
func (ls *lease) String() string          { return fmt.Sprintf("pglock lease %q token %d", ls.a.name, ls.token) }

// Err, Context and Done end a lease whose deadline has passed, as its
// expiry timer does, whether or not the timer's goroutine has run yet: in
// that gap (microseconds, more on a loaded machine) they said the lease
// was held, and Release freed the row and returned nil, where redislock,
// redlock and memlock answered the loss
// (TestObservedLeaseEndsAtDeadlineBeforeItsTimer in tests/pglock). The end
// is reported by the call that made it, before it returns: the caller
// holds nothing the callback may wait for. The lease's own renewals use
// errQuiet.
func (ls *lease) Err() error {
	ls.mu.Lock()
	report := ls.expireDueLocked()
	err := ls.err
	ls.mu.Unlock()
	if report != nil {
		report()
	}
	return err
}

func (ls *lease) Context() context.Context { ls.expireIfDue(); return ls.ctx }
func (ls *lease) Done() <-chan struct{}    { ls.expireIfDue(); return ls.ctx.Done() }

// expireIfDue ends the lease if its deadline has passed, and reports it:
// see Err.
func (ls *lease) expireIfDue() {
	ls.mu.Lock()
	report := ls.expireDueLocked()
	ls.mu.Unlock()
	if report != nil {
		report()
	}
}

// errQuiet is Err for the lease's expiry timer and its renewals, which
// hold ls.op or are the watchdog, that a callback's Release or Extend
// waits for: the end of a lease past its deadline is left to flush, which
// they make once they hold nothing (see flush).
func (ls *lease) errQuiet() error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if report := ls.expireDueLocked(); report != nil {
		ls.unreported = report
	}
	return ls.err
}

// expireDueLocked ends the lease if it is held and its deadline has
// passed, as its expiry timer does: a watchdog lease was not renewed in
// time, a fixed one's lease time ran out. It returns the report of that
// end (nil: it did not end the lease, or nobody is to be told), for the
// caller to make once it has unlocked ls.mu and holds nothing a callback
// may wait for, or to leave to flush. ls.mu is held.
func (ls *lease) expireDueLocked() (report func()) {
	if ls.err != nil || time.Now().Before(ls.deadline) {
		return nil
	}
	cause, why := fence.LostExpired, fmt.Errorf("%w: %q: its lease time ran out", fence.ErrLeaseLost, ls.a.name)
	if ls.a.watchdog {
		// The watchdog's renewals failed until the deadline.
		cause, why = fence.LostRenewFailed, fmt.Errorf("%w: %q was not renewed before its deadline", fence.ErrLeaseLost, ls.a.name)
	}
	ls.endLocked(why)
	return ls.report(cause, why)
}

// end records why the lease ended and cancels its context; the first call
// wins. It reports the cause Released for fence.ErrReleased, LostRemoved
// otherwise; see endAs.
func (ls *lease) end(why error) {
	cause := fence.LostRemoved
	if errors.Is(why, fence.ErrReleased) {
		cause = fence.Released
	}
	ls.endAs(cause, why)
}

// endAs is end with the cause to report to the Observer and the Logger.
// The report is left to flush, which the caller makes once it holds
// nothing that the callback may wait for.
func (ls *lease) endAs(cause fence.LeaseCause, why error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err != nil {
		return
	}
	ls.endLocked(why)
	ls.unreported = ls.report(cause, why)
}

// endLocked records why the held lease ended, stops its expiry timer and
// cancels its context; a row that a renewal may have moved ahead is freed
// unless a Release ends it (Release frees it). ls.mu is held and ls.err
// is nil.
func (ls *lease) endLocked(why error) {
	ls.err = why
	ls.expiry.Stop()
	ls.cancel(why)
	if ls.ahead && !errors.Is(why, fence.ErrReleased) {
		ls.ahead = false
		ls.l.freeOwned(ls.a.name, ls.a.owner)
	}
}

// report returns the report of the lease's end, cause and why (nil:
// nobody is to be told).
func (ls *lease) report(cause fence.LeaseCause, why error) func() {
	l := ls.l
	if l.log == nil && l.obs == nil {
		return nil
	}
	return func() {
		fence.ReportLeaseEnded(ls.ctx, l.obs, l.log, "pglock", fence.LeaseEvent{Backend: backend,
			Name: ls.a.name, Token: ls.token, Cause: cause, Held: time.Since(ls.granted), Err: why})
	}
}

// endReleasing ends the lease as Release is about to free its row, and
// reports whether it did (false: it had ended). Nothing is reported yet:
// releasedAs does, once the statement tells whether the row was still the
// lease's (released) or not (lost).
func (ls *lease) endReleasing() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err != nil {
		return false
	}
	ls.err = fence.ErrReleased
	ls.expiry.Stop()
	ls.cancel(fence.ErrReleased)
	return true
}

// releasedAs settles the end of a lease that endReleasing ended, by what
// the Release returns: a loss (the row was no longer the lease's) as
// LostRemoved, and Err says so too; anything else as Released. It returns
// the report (nil: nobody is to be told), for that Release alone to make:
// left to flush, another goroutine's (an Extend's) could take it and make
// it after Release returned.
func (ls *lease) releasedAs(result error) (report func()) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if errors.Is(result, fence.ErrLeaseLost) && !errors.Is(result, fence.ErrReleased) {
		ls.err = result
		return ls.report(fence.LostRemoved, result)
	}
	return ls.report(fence.Released, fence.ErrReleased)
}

// flush reports the lease's end to the Observer and the Logger, if it has
// ended and nobody has reported it yet. Their callback may call Release or
// Extend, which wait for ls.op and for the watchdog to return: the
// watchdog flushes once it has returned (watchdogDone closed), Extend and
// Release once they have unlocked ls.op, and Release once its result is
// settled, which a Release of the callback then returns.
func (ls *lease) flush() {
	ls.mu.Lock()
	report := ls.unreported
	ls.unreported = nil
	ls.mu.Unlock()
	if report != nil {
		report()
	}
}

// keepRenewed is the watchdog: it renews the lease every third of its TTL
// until the lease ends. A failed renewal is retried sooner; the expiry
// timer ends the lease if none succeeds before the deadline.
func (ls *lease) keepRenewed() {
	defer ls.flush() // after watchdogDone is closed: see flush
	defer close(ls.watchdogDone)
	every := ls.a.ttl / 3
	timer := time.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-ls.ctx.Done():
			return
		case <-timer.C:
		}
		rctx, cancel := context.WithDeadline(ls.ctx, ls.Deadline())
		err := ls.renew(rctx, ls.a.ttl)
		cancel()
		switch {
		case errors.Is(err, fence.ErrLeaseLost):
			return
		case err != nil:
			if !ls.logFailed(err) {
				return // ended while it logged
			}
			if errors.Is(err, errDBClosed) {
				// Nothing will renew it: it ends now, not at its
				// deadline (the watchdog TTL, for a fn that could not be
				// told), with an error that fence.Lead stops on.
				ls.endAs(fence.LostRenewFailed, fmt.Errorf("%w: %q: its *sql.DB was closed, and nothing can renew it: %w", fence.ErrLeaseLost, ls.a.name, closedDB(err)))
				return
			}
			timer.Reset(every / 4)
		default:
			timer.Reset(every)
		}
	}
}

// logFailed logs a failed renewal of the watchdog's, marked as logging,
// and reports whether the watchdog may go on (false: the lease ended
// meanwhile). The handler may call Release, which ends the lease and would
// wait for the watchdog to return, that is for the handler: a deadlock.
// Release does not wait for a watchdog marked logging, and that is safe:
// what Release waits for is a renewal in flight, and there is none (this
// one has returned and unlocked ls.op), and the watchdog starts no other
// once it has seen, under ls.mu here, that the lease ended (Release ends
// it, cancelling ls.ctx under ls.mu, before it reads logging under ls.mu,
// so a Release that did not wait is seen). The watchdog then returns on
// its own, once the handler has, and flushes nothing: Release did.
// Conversely a watchdog that finds the lease ended before it logs does not
// log: a Release may be waiting for it.
func (ls *lease) logFailed(err error) bool {
	log := ls.l.log
	if log == nil {
		return true
	}
	ls.mu.Lock()
	if ls.err != nil {
		// Ended: a Release that read logging false waits for this
		// goroutine.
		ls.mu.Unlock()
		return false
	}
	ls.logging = true
	ls.mu.Unlock()
	log.LogAttrs(ls.ctx, slog.LevelWarn, "pglock: renewal failed",
		slog.String("name", ls.a.name), slog.Int64("token", int64(ls.token)),
		slog.Time("deadline", ls.Deadline()), slog.Any("error", err))
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.logging = false
	return ls.ctx.Err() == nil
}

// movedAheadLocked records that a renewal which did not move the deadline
// moved the row's expiry, or may have: the row is freed when the lease
// ends unreleased (endAs), at once if it has already. ls.mu is held.
func (ls *lease) movedAheadLocked() {
	if ls.err == nil {
		ls.ahead = true
	} else if !errors.Is(ls.err, fence.ErrReleased) {
		ls.l.freeOwned(ls.a.name, ls.a.owner)
	}
}

// lockOp takes ls.op, waiting for it as long as ctx lasts.
func (ls *lease) lockOp(ctx context.Context) error { return ls.lockOpUnless(ctx, nil) }

func (ls *lease) unlockOp() { <-ls.op }

// errConcluded: lockOpUnless found the release concluded.
var errConcluded = errors.New("release concluded")

// lockOpUnless is lockOp that stops waiting with errConcluded once
// concluded is closed (for release: ls.concluded, the release concluded
// meanwhile by the background finish of a Release that gave up; nil for
// never).
func (ls *lease) lockOpUnless(ctx context.Context, concluded <-chan struct{}) error {
	select {
	case ls.op <- struct{}{}:
		return nil
	default:
	}
	select {
	case ls.op <- struct{}{}:
		return nil
	case <-concluded:
		return errConcluded
	case <-ctx.Done():
		return ctx.Err()
	}
}

// renew moves the row's expiry to ttl from now by the database's clock, if
// the row is still this lease's and has not expired; otherwise it ends the
// lease.
func (ls *lease) renew(ctx context.Context, ttl time.Duration) error {
	if err := ls.lockOp(ctx); err != nil {
		return fmt.Errorf("pglock: extend %q: %w", ls.a.name, err)
	}
	defer ls.unlockOp()
	// Quiet: this holds ls.op, which a callback's Release or Extend waits
	// for; the caller flushes the end once it has unlocked it.
	if err := ls.errQuiet(); err != nil {
		return err
	}
	// The statement ends with the lease too: once the lease has ended
	// (a Release, its deadline) its answer can no longer count, and a
	// Release that gave up on its ctx finishes only once this returns.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(ls.ctx, cancel)()
	sent := time.Now()
	res, err := ls.l.db.ExecContext(sctx, ls.l.q.renew, ls.a.name, ls.a.owner, ttl.Microseconds())
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		// It may have run: the row is freed when the lease ends, at once
		// if it has meanwhile (at its deadline, which ends a watchdog's
		// renewal).
		ls.mu.Lock()
		ls.movedAheadLocked()
		ended := ls.err
		ls.mu.Unlock()
		if ended != nil && ctx.Err() == nil {
			return ended // cut short by the lease's end, not by ctx
		}
		return fmt.Errorf("pglock: extend %q: %w", ls.a.name, err)
	}
	if n == 0 {
		if ended := ls.errQuiet(); ended != nil {
			// Ended first (a Release that gave up, whose background
			// finish then freed the row): that end, not a loss.
			return ended
		}
		lost := fmt.Errorf("%w: %q expired, was removed or was taken by another owner", fence.ErrLeaseLost, ls.a.name)
		ls.end(lost)
		return lost
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err != nil {
		// It moved the row, but its reply came after the lease ended
		// (at its deadline): nobody will use the row; free it.
		ls.movedAheadLocked()
		return ls.err
	}
	ls.setDeadline(deadline(sent, ttl))
	ls.expiry.Reset(time.Until(ls.deadline))
	return nil
}

// Extend sets the lease to expire ttl from now by the database's clock;
// see fence.Lease. A watchdog lease goes on being renewed with its watchdog
// TTL afterwards, at its next renewal as scheduled: a ttl that ends before
// that renewal ends the lease at its new Deadline. After Release, Extend returns an error matching both
// fence.ErrLeaseLost and fence.ErrReleased. An Extend under way when the
// lease ends (a Release, even one that gave up on its ctx, or its deadline)
// stops waiting for its statement and returns the lease's end.
func (ls *lease) Extend(ctx context.Context, ttl time.Duration) error {
	if ctx == nil {
		return nilctx.Err("pglock", "Extend")
	}
	if err := fence.ValidateTTL(ttl); err != nil {
		return err
	}
	released := func(err error) error {
		if err == fence.ErrReleased {
			return fmt.Errorf("%w: %q: %w", fence.ErrLeaseLost, ls.a.name, fence.ErrReleased)
		}
		return err
	}
	if err := ls.Err(); err != nil {
		return released(err)
	}
	defer ls.flush() // after renew unlocked ls.op: see flush
	// A Release may end the lease while this waits for ls.op or renews.
	return released(ls.renew(ctx, ttl))
}

// Release deletes the lock row if this lease still owns it and notifies the
// waiters; see fence.Lease. The lease ends locally at once, whatever the
// database answers: on an error (a done ctx, the database unreachable) its
// watchdog stops, so the row expires within its TTL, and calling Release
// again retries to free it sooner. A watchdog that went on renewing would
// hold the lock for ever for an owner that has given it up.
func (ls *lease) Release(ctx context.Context) error {
	if ctx == nil {
		return nilctx.Err("pglock", "Release")
	}
	// The lease ends before the statement is sent: a ctx that its end
	// cancels (its Context, or fence.Run's fn's) must not cancel the
	// statement; it ends at the lease's deadline instead, as the lease's
	// expiry ended it before.
	rctx, stop := releasectx.Detach(ctx, ls.Deadline())
	report, err := ls.release(rctx)
	stop()
	ls.flush() // after release unlocked ls.op, its result settled: see flush
	if report != nil {
		report() // the end this call settled (see releasedAs), as flush would
	}
	ls.mu.Lock()
	wait := ls.watchdogDone != nil && ls.err != nil && !ls.logging // logging: renewing no more, see logFailed
	ls.mu.Unlock()
	if wait {
		// It ends with the lease, once its renewal under way, if any,
		// has returned: at once with a driver that gives up the
		// statement the lease's end cancelled; a driver that does not
		// (lib/pq on a stalled server waits for the answer to its
		// cancel) must not hold up a Release past its ctx, no more than
		// a renewal does (see release). With no renewal under way
		// (ls.op free), the watchdog sends none (the lease has ended)
		// and returns: waited for whatever ctx says.
		select {
		case ls.op <- struct{}{}:
			ls.unlockOp()
			<-ls.watchdogDone
		default:
			select {
			case <-ls.watchdogDone:
			case <-ctx.Done():
			}
		}
	}
	return err
}

func (ls *lease) release(ctx context.Context) (report func(), result error) {
	ls.mu.Lock()
	if ls.released {
		// Concluded (by a Release, or the background finish of one that
		// gave up): no need to wait for a renewal under way.
		defer ls.mu.Unlock()
		return nil, ls.relErr
	}
	// Past its deadline the lease ends here, as Err would: before this
	// waits for a renewal under way, which, its reply read late, would
	// otherwise keep it (see renew), and once more once this holds ls.op.
	// Then it was lost before Release, which returns that. The end is
	// reported by this call, with its result (see Release): reported
	// here, a callback's Release would wait for ls.op. At most one of the
	// two ends it, and then this call's own report (releasedAs) is nil.
	expired := ls.expireDueLocked()
	ls.mu.Unlock()
	defer func() {
		if expired != nil {
			report = alsoReport(expired, report)
		}
	}()
	if err := ls.lockOpUnless(ctx, ls.concluded); errors.Is(err, errConcluded) {
		ls.mu.Lock()
		defer ls.mu.Unlock()
		return nil, ls.relErr
	} else if err != nil {
		// A renewal under way holds ls.op (hung on the database, say):
		// the lease ends here all the same, which cuts that renewal's
		// statement short (see renew), and this Release is finished in
		// the background once that renewal has returned, with a
		// statement bounded as giveUp's, which frees the row whatever
		// the renewal did to it. The background finish waits for the
		// renewal giveUpTimeout at most (a driver slow to give up a
		// statement on a database that hangs), then frees the row
		// without it: the database orders the two statements on the
		// row, and a renewal after the free finds the row no longer
		// its owner's. Its whole life is so bounded by twice
		// giveUpTimeout, whatever the database does: a fixed bound
		// rather than one of the lease's TTL, since all it does is free
		// the row sooner than its expiry, which the TTL bounds anyway.
		// Calling Release again waits for that and returns its result,
		// or retries if it failed.
		ls.end(fence.ErrReleased) // stops the watchdog and the expiry timer
		go ls.finishRelease(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("pglock: release %q: %w", ls.a.name, err)
	}
	defer ls.unlockOp()
	ls.mu.Lock()
	if ls.released {
		defer ls.mu.Unlock()
		return nil, ls.relErr
	}
	if e := ls.expireDueLocked(); e != nil {
		expired = e
	}
	lostBefore := ls.err
	ahead := ls.ahead
	ls.ahead = false // the release frees the row
	ls.mu.Unlock()

	// Lost before Release, the row may still be this lease's all the same
	// (a renewal whose reply did not come moved it past the deadline): it
	// is freed, owner-checked, and Release returns the loss.
	// Bounded as giveUp's is: the answer is the loss whatever the
	// statement does, and a database that no longer answers (the usual
	// reason for the loss) must not hold up a Release without deadline.
	qctx := ctx
	if lostBefore != nil && lostBefore != fence.ErrReleased {
		var cancel context.CancelFunc
		qctx, cancel = context.WithTimeout(ctx, giveUpTimeout)
		defer cancel()
	} else if ls.endReleasing() {
		// The lease ends before the row is freed: once the statement
		// commits another Acquire may take the lock, and this lease's
		// Err and Context must say it is over by then, not after the
		// reply (TestRandomCancelsNeverTwoHolders saw a grant while
		// the releasing lease still had Err nil). Its end is reported
		// by the result.
		defer func() { report = ls.releasedAs(result) }()
	} else if lostBefore == nil {
		// It ended since it was read above (its expiry timer): as if
		// before Release.
		ls.mu.Lock()
		lostBefore = ls.err
		ls.mu.Unlock()
	}
	var err error
	var notified sql.NullString
	qerr := ls.l.db.QueryRowContext(qctx, ls.l.q.release, ls.a.name, ls.a.owner, ls.l.table).Scan(&notified)
	// Under serializable (an operator's default_transaction_isolation),
	// the release may fail with a serialization failure among concurrent
	// transactions on other rows (first acquisitions of new names: a
	// fresh-clone run of TestSerializableDefaultIsolation failed so); it
	// was rolled back and freed nothing, so it is sent again, as
	// PostgreSQL asks of such failures.
	for wait := time.Millisecond; isSQLState(qerr, serializationFailure) && wait <= 64*time.Millisecond && pause.For(qctx, wait); wait *= 2 {
		qerr = ls.l.db.QueryRowContext(qctx, ls.l.q.release, ls.a.name, ls.a.owner, ls.l.table).Scan(&notified)
	}
	ls.mu.Lock()
	if ls.released {
		// Concluded meanwhile without ls.op: the background finish of a
		// Release that gave up behind this one freed the row once its
		// bound had passed (finishRelease), which is why this statement
		// may have found nothing to free. Its result stands.
		defer ls.mu.Unlock()
		return nil, ls.relErr
	}
	tried := ls.relTried
	// A failed statement may have committed, its reply lost, and a row
	// moved ahead is freed in the background below, by the lease's own
	// statement (TestRetriedReleaseAfterOwnGiveBack): a Release retried
	// later may find it freed so.
	ls.relTried = ls.relTried || qerr != nil && !errors.Is(qerr, sql.ErrNoRows)
	ls.mu.Unlock()
	switch {
	case lostBefore != nil && lostBefore != fence.ErrReleased:
		err = lostBefore // conclusive: the lease was lost before Release
	case errors.Is(qerr, sql.ErrNoRows) && !tried:
		err = fmt.Errorf("%w: %q expired, was removed or was taken by another owner", fence.ErrLeaseLost, ls.a.name)
	case errors.Is(qerr, sql.ErrNoRows):
		// An earlier Release's statement may have freed it (relTried).
	case qerr != nil:
		ls.end(fence.ErrReleased) // stops the watchdog and the expiry timer
		if ahead {
			// The row may outlive the deadline, and this failed to
			// free it: free it in the background, as an unreleased
			// end does.
			ls.l.freeOwned(ls.a.name, ls.a.owner)
		}
		return nil, fmt.Errorf("pglock: release %q: %w", ls.a.name, qerr)
	}
	if err == nil {
		ls.end(fence.ErrReleased)
	} else {
		ls.end(err)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.concludeLocked(err) // unless concluded meanwhile, as above
	return nil, ls.relErr
}

// alsoReport returns a report that makes first, then then (nil: none).
func alsoReport(first, then func()) func() {
	if then == nil {
		return first
	}
	return func() { first(); then() }
}

// concludeLocked records the release's conclusion, err, unless one was
// recorded already, and wakes the Releases waiting for ls.op. ls.mu is
// held.
func (ls *lease) concludeLocked(err error) {
	if !ls.released {
		ls.released, ls.relErr = true, err
		close(ls.concluded)
	}
}

// finishRelease finishes in the background a Release that gave up waiting
// for a renewal under way (see release): once the renewal has returned,
// within giveUpTimeout, it releases as Release does, bounded by
// giveUpTimeout; otherwise it frees the row, owner-checked, bounded the
// same, without the renewal's turn, and records the release if that freed
// it (a later Release then returns nil, or the loss if the lease was lost
// before, as release does); if not, a later Release tries again.
func (ls *lease) finishRelease(ctx context.Context) {
	wctx, cancel := context.WithTimeout(context.Background(), giveUpTimeout)
	err := ls.lockOp(wctx)
	cancel()
	bctx, cancel := context.WithTimeout(ctx, giveUpTimeout)
	defer cancel()
	if err == nil {
		ls.unlockOp()
		if report, _ := ls.release(bctx); report != nil {
			report() // none: the Release that gave up ended the lease
		}
		return
	}
	var notified sql.NullString
	if ls.l.db.QueryRowContext(bctx, ls.l.q.release, ls.a.name, ls.a.owner, ls.l.table).Scan(&notified) == nil {
		ls.mu.Lock()
		if !ls.released {
			// As release concludes: the loss if the lease was lost
			// before the Release that gave up ended it.
			var relErr error
			if ls.err != fence.ErrReleased {
				relErr = ls.err
			}
			ls.concludeLocked(relErr)
		}
		ls.mu.Unlock()
	}
}
