package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/atomictime"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/fencekit/fence/internal/releasectx"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lease is a lock held through etcd: a fence.Lease whose token is its key's
// create revision. Its methods are safe for concurrent use.
type Lease struct {
	l        *Locker
	name     string
	key      string
	keyb     []byte // key's bytes, shared with the create Txn's request
	token    fence.Token
	watchdog bool
	acquired time.Time // for the hold time reported to the Observer

	ctx    context.Context // cancelled with err as cause when the lease ends
	cancel context.CancelCauseFunc

	// op serialises Extend and Release, which use or replace the etcd
	// lease: a token in it is the right to proceed. A channel rather than
	// a mutex, so that a call waiting for another (an Extend hung on a
	// paused member) still returns when its own ctx ends.
	op chan struct{}
	// run's state, due time and, once started, its context, its stop and
	// the channel closed when it returns: guarded by l.starter.mu. runFrom
	// is when the etcd lease's grant or last renewal was sent before the
	// lease was made, from which run counts the first renewal.
	runState int
	runDue   time.Time
	runFrom  time.Time
	runCtx   context.Context
	stopRun  context.CancelFunc
	runDone  chan struct{}
	released bool  // Release reached a conclusion
	relErr   error // its result
	// noReuse: the create Txn had an attempt that timed out, which may be
	// applied late; the etcd lease is revoked, never kept. Set before the
	// lease is returned.
	noReuse bool
	// revokedOnFail: a Release that failed revoked the etcd lease, and
	// with it the key (the revoke's success read, at once or by its
	// retry in the background).
	revokedOnFail atomic.Bool
	// delTried: a Release that failed sent its delete, which may have
	// been applied, its reply lost: a later Release that finds the key
	// gone takes it for that delete's doing.
	delTried atomic.Bool
	// goneBefore: a Release that failed without sending its delete (its
	// ctx done) found the key gone before it revoked the etcd lease (see
	// checkGone).
	goneBefore atomic.Bool
	// modRev is the key's mod revision as this lease last wrote it (its
	// create revision, then each Extend's move): every move compares it,
	// so that an Extend's Txn that arrives late, after that Extend gave
	// up and revoked the etcd lease it would move the key to, finds the
	// key changed and does nothing. Used under op.
	modRev int64

	mu       sync.Mutex
	id       clientv3.LeaseID // the etcd lease the key is attached to
	ttl      time.Duration
	granted  time.Duration // the TTL etcd granted id (at least ttl)
	sent     time.Time     // when id's grant or last renewal was sent
	deadline time.Time
	dl       atomictime.Time // deadline's copy for Deadline, which never blocks
	// own is the deadline of the etcd lease the key is on (id), as its
	// grant or last renewal gives it; deadline is own, or capAt if that is
	// sooner: capAt (zero: none) is set by an Extend while its move may
	// yet put the key on an etcd lease of a shorter TTL (see capDeadline).
	own   time.Time
	capAt time.Time
	err   error         // why the lease ended; nil while held
	moved chan struct{} // tells run that Extend moved the deadline
	// unreported reports the lease's end, until flush has (nil: not
	// ended, or reported).
	unreported func()
	// releasing: a Release that holds ls.op ended the lease as its delete
	// left (endReleasing) and has not yet decided, on the reply, whether
	// to keep the etcd lease. A Release that cannot take ls.op meanwhile
	// revokes it instead (see releaseFailed) and sets revokeTaken, and the
	// etcd lease is not kept.
	releasing   bool
	revokeTaken bool
	// logging: run is logging a failed renewal, with no renewal under
	// way, and renews no more if halted meanwhile (see logFailed): join
	// does not wait for it, as the Logger's handler may be what calls
	// Release.
	logging bool
}

var _ fence.Lease = (*Lease)(nil)

func (l *Locker) newLease(ctx context.Context, name, key string, keyb []byte, rev int64, sp spare, watchdog, noReuse bool, sent time.Time) *Lease {
	ls := &Lease{
		l: l, name: name, key: key, keyb: keyb, token: fence.Token(rev), watchdog: watchdog,
		id: sp.id, ttl: sp.ttl, granted: sp.granted, sent: sent, moved: make(chan struct{}, 1),
		op: make(chan struct{}, 1), acquired: time.Now(), modRev: rev, noReuse: noReuse,
	}
	ls.setDeadline(deadline(sent, sp.ttl))
	ls.ctx, ls.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	if !l.hold(ls) {
		ls.cancel(errLockerClosed)
		return nil // Close came: it would not release this lease
	}
	ls.startRun()
	return ls
}

// endLocked ends the lease with why, and takes it off the Locker's list
// of leases held, which Close releases. ls.mu is held.
func (ls *Lease) endLocked(why error) {
	ls.err = why
	ls.cancel(why)
	ls.l.forget(ls)
}

// Name returns the lock name.
func (ls *Lease) Name() string { return ls.name }

// Token returns the create revision of the lease's key.
func (ls *Lease) Token() fence.Token { return ls.token }

// Key returns the lease's key in etcd.
func (ls *Lease) Key() string { return ls.key }

// Done is closed when the lease has ended.
func (ls *Lease) Done() <-chan struct{} { ls.expireIfDue(); return ls.ctx.Done() }

// Context is cancelled with Err as its cause when the lease ends.
func (ls *Lease) Context() context.Context { ls.expireIfDue(); return ls.ctx }

// Deadline returns the local time before which the lease is known to be held.
func (ls *Lease) Deadline() time.Time { return ls.dl.Load() }

// setDeadline sets the deadline of the etcd lease the key is on, under
// ls.mu, and the lease's deadline (capped: see capDeadline) and the copy
// that Deadline reads without it.
func (ls *Lease) setDeadline(d time.Time) { ls.own = d; ls.applyDeadline() }

// applyDeadline sets the lease's deadline from own and capAt. ls.mu is
// held.
func (ls *Lease) applyDeadline() {
	d := ls.own
	if !ls.capAt.IsZero() && ls.capAt.Before(d) {
		d = ls.capAt
	}
	ls.deadline = d
	ls.dl.Store(d)
}

// capDeadline holds the deadline at c at most while an Extend's move
// that got no answer yet may put the key on its new etcd lease, which
// etcd deletes from c on if the Extend shortens the lease: the move may be
// applied with its reply lost, or late, and etcd then frees the lock by
// c, while a renewal of the old etcd lease (run's) would have the holder
// believe it held longer (TestShortExtendReplyLostCapsDeadline,
// TestShortExtendMoveLandsDuringBackgroundSettle). run is told if that
// brings the deadline closer. uncapDeadline lifts it once no move of that
// Extend can apply any more. The caller holds ls.op.
func (ls *Lease) capDeadline(c time.Time) {
	ls.mu.Lock()
	ls.capAt = c
	lower := c.Before(ls.deadline)
	ls.applyDeadline()
	ls.mu.Unlock()
	if lower {
		select {
		case ls.moved <- struct{}{}:
		default:
		}
	}
}

// uncapDeadline lifts capDeadline's cap, as the Extend that set it gives
// back ls.op, its move settled: the key is on the etcd lease of ls.id.
// An ended lease keeps its deadline.
func (ls *Lease) uncapDeadline() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.capAt.IsZero() || ls.err != nil {
		return
	}
	ls.capAt = time.Time{}
	ls.applyDeadline()
}

// Err returns nil while the lease is held, and afterwards why it ended.
// Past its deadline the lease has ended, whether or not its run has seen
// it yet (see expireDueLocked).
func (ls *Lease) Err() error {
	ls.mu.Lock()
	report := ls.expireDueLocked()
	err, id := ls.err, ls.id
	ls.mu.Unlock()
	if report != nil {
		// As run does; Err must not wait for etcd. Counted before
		// the report, whose callback may close the Locker
		// (TestCloseWaitsForErrsRevoke).
		counted := ls.l.countGiveBack(id)
		go ls.l.giveBackCounted(ls.ctx, counted, id, nil, cleanupTimeout)
		report()
	}
	return err
}

// expireIfDue is Err for Context and Done: it ends a lease past its
// deadline, and reports it.
func (ls *Lease) expireIfDue() { _ = ls.Err() }

// errNow is Err for the lease's own calls, which may hold ls.op, that a
// callback's Release or Extend waits for, or be run, that Release joins:
// it ends nothing and reports nothing. Each of them that must not go on
// past the deadline checks it itself (ls.expired, whose report is left to
// flush).
func (ls *Lease) errNow() error { ls.mu.Lock(); defer ls.mu.Unlock(); return ls.err }

// expireDueLocked ends the lease if it is held and its deadline has
// passed, as run does when its expiry timer fires (with the error and
// cause of expired), whether or not run has started and picked that case
// (in that gap, Err said the lease was held, Done was open, and a Release
// deleted the key and reported Released:
// TestObservedLeaseEndsAtDeadlineBeforeItsTimer). It returns the report of
// that end (nil: not ended here), for the caller to make once it has
// unlocked ls.mu and holds nothing a callback may wait for (the callback
// may call Release, which waits for ls.op and joins run); the caller gives
// back the etcd lease (ls.id), as run does. ls.mu is held.
func (ls *Lease) expireDueLocked() (report func()) {
	if ls.err != nil || time.Now().Before(ls.deadline) {
		return nil
	}
	cause, why := ls.expiry()
	ls.endLocked(why)
	return func() { ls.ended(cause, why) }
}

// String describes the lease for logs.
func (ls *Lease) String() string { return fmt.Sprintf("etcdlock lease %q token %d", ls.name, ls.token) }

// end records why the lease ended and cancels its context; the first call
// wins. It reports whether this call ended it. The cause it reports is
// Released for fence.ErrReleased, LostRemoved otherwise; see endAs.
func (ls *Lease) end(why error) bool {
	cause := fence.LostRemoved
	if why == fence.ErrReleased {
		cause = fence.Released
	}
	return ls.endAs(why, cause)
}

// endAs is end with the cause to report to the Observer and the Logger.
// The report is left to flush: the lease ends so only in run, Extend and
// Release, each of which flushes once it holds nothing that the callback
// may wait for (see flush). (Err, Context and Done, and Extend and Release
// before they wait for anything, end a lease past its deadline otherwise,
// and report it themselves: see expireDueLocked.)
func (ls *Lease) endAs(why error, cause fence.LeaseCause) bool {
	ls.mu.Lock()
	if ls.err != nil {
		ls.mu.Unlock()
		return false
	}
	ls.endLocked(why)
	ls.unreported = func() { ls.ended(cause, why) }
	ls.mu.Unlock()
	return true
}

// endReleasing ends the lease as Release is about to send the delete that
// frees its key, and reports whether it did (false: it had ended). Once the
// delete is applied another Acquire may take the lock, while Release still
// waits for the reply: the lease's Err, Done and Context must say it is
// over by then. Nothing is reported yet: releasedAs does, once the reply
// tells whether the key was still the lease's (released) or not (lost).
// The caller holds ls.op and has halted run.
func (ls *Lease) endReleasing() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err != nil {
		return false
	}
	// Not taken off the Locker's list yet: Release does that as it
	// returns, so that a Close called meanwhile waits for it (see Release).
	ls.err = fence.ErrReleased
	ls.cancel(fence.ErrReleased)
	ls.releasing = true
	return true
}

// takeRevoke reports whether a Release that cannot take ls.op may revoke
// the etcd lease of a lease that a Release in flight ended (endReleasing)
// and has not yet decided to keep; if so, it may not keep it any more.
func (ls *Lease) takeRevoke() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.releasing {
		ls.revokeTaken = true
	}
	return ls.releasing
}

// mayKeep ends the window in which a Release without ls.op may take over
// the revoke of the etcd lease (see takeRevoke), and reports whether none
// did: the Release that ended the lease may then keep it.
func (ls *Lease) mayKeep() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.releasing = false
	return !ls.revokeTaken
}

// releasedAs settles the end of a lease that endReleasing ended, by what
// the Release returns: a loss (its key was no longer there) as
// LostRemoved, and Err says so too; anything else (nil, or a Release that
// failed) as Released. It returns the report, for that Release alone to
// make once it holds nothing (as flush): left to flush, another
// goroutine's (an Extend's) could take it and make it after Release
// returned.
func (ls *Lease) releasedAs(result error) (report func()) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.releasing = false
	cause, why := fence.Released, error(fence.ErrReleased)
	if errors.Is(result, fence.ErrLeaseLost) && !errors.Is(result, fence.ErrReleased) {
		ls.err, cause, why = result, fence.LostRemoved, result
	}
	return func() { ls.ended(cause, why) }
}

// flush reports the lease's end to the Observer and the Logger, if it has
// ended and nobody has reported it yet. Their callback may call Release or
// Extend, which wait for ls.op and for run to return: run flushes once it
// has returned (done closed), Extend and Release once they have given back
// ls.op, and Release once its result is settled, which a Release of the
// callback then returns.
func (ls *Lease) flush() {
	ls.mu.Lock()
	report := ls.unreported
	ls.unreported = nil
	ls.mu.Unlock()
	if report != nil {
		report()
	}
}

// expired ends the lease whose deadline has passed: a watchdog lease's
// renewals failed until then, a fixed one was not extended. It reports
// whether this call ended it.
func (ls *Lease) expired() bool {
	cause, why := ls.expiry()
	return ls.endAs(why, cause)
}

// expiry returns the cause and the error of the end of a lease whose
// deadline passed.
func (ls *Lease) expiry() (fence.LeaseCause, error) {
	if ls.watchdog {
		return fence.LostRenewFailed, ls.lostf("not renewed before its deadline")
	}
	return fence.LostExpired, ls.lostf("expired")
}

func (ls *Lease) lostf(format string, args ...any) error {
	return fmt.Errorf("%w: %q: "+format, append([]any{fence.ErrLeaseLost, ls.name}, args...)...)
}

// watchDelay is how long a lease is held before its key is watched. A
// watch costs a create and a cancel on the server and a goroutine on
// each side, as much as a third of an uncontended acquire+release; a lock
// released within watchDelay never pays for it. The watch reads from the
// key's creation, so a delete made earlier is seen the moment it starts:
// Done follows a delete by at most watchDelay, instead of at once, during
// the lease's first watchDelay only. The token guards the resource meanwhile,
// as it does for a holder paused after any check. run itself starts then
// too (or at the deadline or first renewal, if sooner): a lock released
// sooner starts no goroutine at all.
const watchDelay = 10 * time.Millisecond

// startRun has the Locker's starter start, after watchDelay at most, the
// goroutine that watches the key, keeps a watchdog lease renewed and ends
// the lease at its deadline.
//
// The first renewal is due a third of the lease time after the etcd
// lease's grant or last renewal was sent (ls.sent, from which the deadline
// is measured), not after the lease was made: an Acquire that took most of
// the lease time (attempts cut on a stalled cluster and sent again, a kept
// etcd lease or a waiter's renewal up to a tenth of it old) would renew
// only after its deadline, and the lease end, lost, on a healthy cluster.
func (ls *Lease) startRun() {
	now := time.Now()
	sent := ls.sentAt()
	delay := min(watchDelay, time.Until(ls.Deadline()))
	if ls.watchdog {
		delay = min(delay, ls.renewInterval()-now.Sub(sent))
	}
	ls.runFrom = sent
	ls.l.starter.add(ls, now.Add(max(delay, 0)))
}

// The states of a lease's run, guarded by its Locker's starter.mu.
const (
	runPending = iota // not started yet
	runStarted        // started (it may have returned since)
	runHalted         // halted before it started: it never will
)

// starter starts the runs of a Locker's leases when they are due, on one
// timer for all of them. A timer per lease, armed on Acquire and stopped on
// Release, cost a bare create+delete pair some 15 µs (a 10 ms timer is the
// earliest of the process's, and arming it wakes the network poller), if
// within the noise of BenchmarkInterleaved, and three allocations. The
// shared timer stays armed while leases are pending, so a stream of short
// locks arms it once per watchDelay, not once per lock.
type starter struct {
	mu      sync.Mutex
	pending []*Lease    // runPending or runHalted, not started
	timer   *time.Timer // calls fire; nil until the first lease
	at      time.Time   // when timer fires; zero: not armed
}

// add makes ls pending, to start at due.
func (s *starter) add(ls *Lease, due time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls.runDue = due
	s.pending = append(s.pending, ls)
	if s.at.IsZero() || due.Before(s.at) {
		s.arm(due)
	}
}

// arm sets the timer to fire at due. The caller holds s.mu.
func (s *starter) arm(due time.Time) {
	s.at = due
	if s.timer == nil {
		s.timer = time.AfterFunc(time.Until(due), s.fire)
		return
	}
	s.timer.Reset(time.Until(due))
}

// fire starts the runs that are due, drops the halted ones, and arms the
// timer for the next pending one. A lease added between the timer firing
// and fire taking s.mu did not arm it (s.at was set): fire sees it here.
func (s *starter) fire() {
	s.mu.Lock()
	s.at = time.Time{}
	now := time.Now()
	var next time.Time
	var due []*Lease
	kept := s.pending[:0]
	for _, ls := range s.pending {
		switch {
		case ls.runState == runHalted:
		case !ls.runDue.After(now):
			ctx, cancel := context.WithCancel(ls.ctx)
			ls.runCtx, ls.stopRun, ls.runDone, ls.runState = ctx, cancel, make(chan struct{}), runStarted
			due = append(due, ls)
		default:
			kept = append(kept, ls)
			if next.IsZero() || ls.runDue.Before(next) {
				next = ls.runDue
			}
		}
	}
	clear(s.pending[len(kept):])
	s.pending = kept
	if !next.IsZero() {
		s.arm(next)
	}
	s.mu.Unlock()
	for _, ls := range due {
		go ls.run(ls.runCtx, ls.runDone, ls.runFrom)
	}
}

// lockOp takes ls.op, or returns ctx's error if ctx ends first; free, it
// takes it even if ctx has ended (the callers then decide on ctx).
func (ls *Lease) lockOp(ctx context.Context) error {
	select {
	case ls.op <- struct{}{}:
		return nil
	default:
	}
	select {
	case ls.op <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (ls *Lease) unlockOp() { <-ls.op }

// halt tells run to stop, without waiting: a run not started yet never
// will. The caller holds ls.op.
func (ls *Lease) halt() {
	s := &ls.l.starter
	s.mu.Lock()
	defer s.mu.Unlock()
	switch ls.runState {
	case runPending:
		ls.runState = runHalted
	case runStarted:
		ls.stopRun()
	}
}

// join waits for a halted run to return. The caller holds ls.op.
func (ls *Lease) join() {
	s := &ls.l.starter
	s.mu.Lock()
	started, done := ls.runState == runStarted, ls.runDone
	s.mu.Unlock()
	if !started {
		return
	}
	ls.mu.Lock()
	logging := ls.logging // renewing no more: see logFailed
	ls.mu.Unlock()
	if !logging {
		<-done
	}
}

// run ends the lease when its key is deleted (released by nobody else: the
// etcd lease expired or was revoked, or an operator deleted it) or when its
// deadline passes, and renews a watchdog lease every third of its TTL. A
// lost lease's etcd lease is revoked, so that the next in line need not
// wait for it to expire, and the revoke retried until it gets through
// (see giveBack).
func (ls *Lease) run(ctx context.Context, done chan<- struct{}, started time.Time) {
	defer ls.flush() // after done is closed: see flush
	defer close(done)
	if ctx.Err() != nil {
		return // halted as it started
	}
	// The watch runs in a goroutine of its own: clientv3's Watch blocks
	// until it reaches a server, and the deadline must not wait for that.
	// It reads from the key's creation, so it sees a delete made before
	// run started (see watchDelay).
	wctx, stopWatch := context.WithCancel(ctx)
	deleted := make(chan error, 1)
	watched := make(chan struct{})
	go func() { defer close(watched); ls.watchKey(wctx, deleted) }()
	defer func() { stopWatch(); <-watched }()

	expiry := time.NewTimer(time.Until(ls.Deadline()))
	defer expiry.Stop()
	renew := time.NewTimer(max(0, ls.renewInterval()-time.Since(started)))
	defer renew.Stop()
	if !ls.watchdog {
		renew.Stop()
	}
	// Once ctx is cancelled (Release sends its delete right after), a
	// delete or a deadline seen is no loss of run's to report: Release
	// decides. A delete seen before the cancel was not Release's. end ends
	// the lease with its cause (see endAs) and reports whether it did.
	lose := func(end func() bool) {
		if ctx.Err() != nil {
			return
		}
		if end() {
			// Retried in the background if it does not get through (a
			// cluster without quorum): the next leader gives the etcd
			// lease its whole TTL again, and the key would hold the lock
			// for nobody that long after quorum is back.
			ls.l.giveBack(ls.ctx, ls.etcdLease(), nil)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-ls.l.client.Ctx().Done():
			// The user closed the client: nothing renews the etcd lease or
			// watches the key any more, and no revoke can be sent.
			if ctx.Err() == nil {
				// Matching fence.ErrClosed: fence.Lead then campaigns
				// at once, and stops, rather than back off first.
				ls.endAs(ls.lostf("%w", errClientClosed), fence.LostRenewFailed)
			}
			return
		case <-ls.moved:
			expiry.Reset(time.Until(ls.Deadline()))
			if ls.watchdog {
				// Due a third of the lease time after the new etcd
				// lease's Grant was sent, from which the deadline is
				// measured: an Extend that took most of the lease time
				// would otherwise renew after its deadline.
				renew.Reset(max(0, ls.renewInterval()-time.Since(ls.sentAt())))
			}
		case <-expiry.C:
			if d := ls.Deadline(); time.Now().Before(d) {
				expiry.Reset(time.Until(d))
				continue
			}
			lose(ls.expired)
			return
		case why := <-deleted:
			lose(func() bool { return ls.end(why) })
			return
		case <-renew.C:
			if err := ls.renew(ctx); err != nil {
				if ctx.Err() != nil {
					return // halted: the renewal was cancelled, not failed
				}
				if errors.Is(err, fence.ErrLeaseLost) {
					lose(func() bool { return ls.end(err) })
					return
				}
				if !ls.logFailed(ctx, err) {
					return // halted while it logged
				}
				renew.Reset(retryInterval)
				continue
			}
			expiry.Reset(time.Until(ls.Deadline()))
			renew.Reset(ls.renewInterval())
		}
	}
}

// logFailed logs a failed renewal of run's, marked as logging, and
// reports whether run may go on (false: halted meanwhile). The handler may
// call Release, which halts run and joins it, that is waits for the
// handler: a deadlock. join does not wait for a run marked logging, and
// that is safe: what Release joins run for is a renewal in flight (which
// could move the key Release deletes, or end the lease as lost) and run's
// fields, and there is no renewal under way (this one has returned), run
// starts no other and touches no field of the lease once it has seen,
// under ls.mu here, that it was halted (halt cancels ctx before join reads
// logging under ls.mu, so a join that did not wait is seen): it returns,
// stopping its watch, once the handler has. Conversely a run that finds
// itself halted before it logs does not log: a join may be waiting for it
// (and a renewal cut short by Release is no failure).
func (ls *Lease) logFailed(ctx context.Context, err error) bool {
	if ls.l.log == nil {
		return true
	}
	ls.mu.Lock()
	if ctx.Err() != nil {
		// Halted: a renewal that Release cut short is no failure, and a
		// join that read logging false waits for this goroutine.
		ls.mu.Unlock()
		return false
	}
	ls.logging = true
	ls.mu.Unlock()
	ls.renewFailed(err)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.logging = false
	return ctx.Err() == nil
}

// watchKey watches the lease's key from its creation until ctx ends, and
// sends why on deleted when the key is deleted. If the watch fails
// (compacted past, cancelled by the server), it reads the key and watches
// again from there.
func (ls *Lease) watchKey(ctx context.Context, deleted chan<- error) {
	c := ls.l.client
	rev := int64(ls.token) + 1
	for {
		wctx, cancel := context.WithCancel(ctx)
		for wr := range c.Watch(wctx, ls.key, clientv3.WithRev(rev), clientv3.WithFilterPut()) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					cancel()
					deleted <- ls.lostf("its key %s was deleted at revision %d", ls.key, ev.Kv.ModRevision)
					return
				}
			}
		}
		cancel()
		for {
			if ctx.Err() != nil {
				return
			}
			resp, err := c.Get(ctx, ls.key)
			if err == nil {
				if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != int64(ls.token) {
					deleted <- ls.lostf("its key %s is gone", ls.key)
					return
				}
				rev = resp.Header.Revision + 1
				break
			}
			retry := time.NewTimer(retryInterval)
			select {
			case <-ctx.Done():
			case <-retry.C:
			}
			retry.Stop()
		}
	}
}

// etcdLease returns the etcd lease the key is attached to.
func (ls *Lease) etcdLease() clientv3.LeaseID {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.id
}

// sentAt returns when the grant or last renewal of the etcd lease the key
// is on was sent.
func (ls *Lease) sentAt() time.Time {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.sent
}

// ttlNow returns the lease time of the etcd lease the key is on.
func (ls *Lease) ttlNow() time.Duration {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.ttl
}

func (ls *Lease) renewInterval() time.Duration {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.ttl / 3
}

// renew keeps the etcd lease alive once, checks that the key is still
// there, and moves the deadline. An error matching fence.ErrLeaseLost means
// the etcd lease or the key is gone. It does not
// take ls.op, which Release holds while it stops run: an Extend that moved
// the key to a new etcd lease meanwhile is told apart by the lease ID.
func (ls *Lease) renew(ctx context.Context) error {
	ls.mu.Lock()
	id, ttl, dl := ls.id, ls.ttl, ls.deadline
	ls.mu.Unlock()
	// Each attempt gets a sixth of the TTL at most: a member that hangs
	// (paused, or cut off) keeps its connection open, and clientv3's
	// round-robin balancer sends the next attempt to another member.
	rctx, cancel := context.WithDeadline(ctx, dl)
	defer cancel()
	rctx, cancel2 := context.WithTimeout(rctx, max(ttl/6, retryInterval))
	defer cancel2()
	// A renewal keeps the etcd lease, not the key: one deleted by hand
	// (etcdctl del) leaves the etcd lease alive, and only the watch tells.
	// A watch that sits on a member that hangs never does, while renewals
	// get through the others: the lease would stay held, for ever, while
	// another Locker takes the lock. So each renewal also reads the key,
	// as a waiter checks its own after each renewal; at the same time, so
	// that a read stuck on such a member does not delay the next renewal.
	// A read that fails proves nothing either way: the next one reads
	// again.
	read := make(chan bool, 1)
	go func() {
		resp, err := ls.l.client.Get(rctx, ls.key, clientv3.WithKeysOnly())
		read <- err == nil && (len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != int64(ls.token))
	}()
	sent := time.Now()
	_, err := ls.l.client.KeepAliveOnce(rctx, id)
	gone := <-read
	ls.mu.Lock()
	defer ls.mu.Unlock()
	switch {
	case ls.err != nil:
		// Ended meanwhile (a Release, or its deadline seen by Err):
		// final, whatever etcd answered. A renewal that got through is
		// undone by the revoke of the etcd lease that the end gives back.
		return ls.err
	case ls.id != id:
		return nil // Extend replaced the etcd lease and set the deadline
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return ls.lostf("its etcd lease %x is gone", int64(id))
	case err != nil:
		return err
	case gone:
		return ls.lostf("its key %s is gone", ls.key)
	}
	ls.setDeadline(deadline(sent, ttl))
	ls.sent = sent
	return nil
}

// Extend makes the lease last ttl from now; see fence.Lease. etcd cannot
// change a lease's TTL, so Extend grants a new etcd lease of ttl, moves the
// key to it in a Txn that holds only while the key is as this lease last
// wrote it (its create revision, the token, does not change; its mod
// revision is each move's), and revokes the old one. A move that got no
// answer is settled before the new etcd lease is revoked (see settleMove),
// tried again while the move's ctx lasts and for a second after; if etcd
// cannot tell whether it was applied, the lease ends. Extend waits for
// that settle until ctx ends (for a tenth of a second if it had ended
// already, enough for a member that answers): past that, the settle goes
// on in the background, and Extend returns an error that matches ctx's
// and says the move's outcome is being settled, not fence.ErrLeaseLost
// (unless the lease has ended meanwhile); the lease then goes on or ends
// as lost, as the settle finds, and the lease's Release and Extend, and
// Locker.Close, wait for it within their own ctx. A Grant or move that
// fails with gRPC's Unavailable or a dropped proposal (a leader change, a
// member's restart) is sent again after a back-off, within ctx and until
// the lease's deadline, as one that timed out. Revokes after ctx has ended (of an etcd
// lease that holds no key, or of a lease that has ended) wait a tenth of
// a second and are tried again in the background. From the Grant's send
// until the move is settled, Deadline is no later than ttl from that
// send: etcd may delete the key by then if the move was applied (a
// shorter ttl than the lease had). A
// watchdog lease is then renewed every third of ttl. After Release, Extend
// returns an error matching both fence.ErrLeaseLost and fence.ErrReleased,
// and so after Locker.Close, which released the lease; during Close, of a
// lease it has not released yet, one matching fence.ErrClosed, having sent
// nothing, and so does one under way when Close is called that has not
// sent its move yet (its Grant cut short), the Deadline unmoved.
func (ls *Lease) Extend(ctx context.Context, ttl time.Duration) (result error) {
	if ctx == nil {
		return nilctx.Err("etcdlock", "Extend")
	}
	// Whichever way it finds the lease released (before it, or during
	// its Grant or move, by a Release or Close): moveTo returned the
	// lease's Err as it was (TestExtendReleasedByCloseDuringMove).
	defer func() { result = ls.extendErr(result) }()
	if err := validateTTL(ttl); err != nil {
		return err
	}
	// Past its deadline the lease ends here, as Err would, before this
	// waits for ls.op; it is reported at once (this holds nothing). Once
	// this holds ls.op, the deadline is checked again below. A lease that
	// has ended returns at once too, rather than wait for ls.op: an Extend
	// called back by the Observer told of the end of a Release or Extend
	// that holds it does not wait for that call to return.
	ls.mu.Lock()
	expired := ls.expireDueLocked()
	ended, id := ls.err, ls.id
	ls.mu.Unlock()
	if expired != nil {
		ls.l.giveBackWithin(ctx, id, nil)
		expired()
	}
	if ended != nil {
		return ended
	}
	// Counted for Locker.Close until it returns, or its settle in the
	// background ends; refused once Close was called, whose wait it would
	// escape (TestExtendAfterClose). Close cuts short its wait for ls.op
	// and its Grant (xctx), which change nothing of the lease, so that it
	// releases the lease at once: a Grant tried again after Unavailable
	// held Close until Close's ctx ended, and the lease stayed held
	// (TestCloseDuringUnavailableRetry).
	xctx, settled, err := ls.l.settleStarted(ctx)
	if err != nil {
		return fmt.Errorf("etcdlock: extend %q: %w", ls.name, err)
	}
	if err := ls.lockOp(xctx); err != nil {
		ls.l.settleEnded(settled)
		return fmt.Errorf("etcdlock: extend %q: %w", ls.name, closedBy(xctx, err))
	}
	// held: this call still holds ls.op, and gives it back as it returns;
	// a settle left to the background (settleBehind) takes it over, and
	// the count with it.
	held := true
	defer func() {
		if held {
			ls.uncapDeadline()
			ls.unlockOp()
			// Counted out before the report: its callback may close
			// the Locker, which waits for this count.
			ls.l.settleEnded(settled)
			ls.flush() // after unlockOp: see flush
		}
	}()
	// Every etcd lease this call revokes holds no key (the key is on
	// another), or belongs to a lease that has ended: revoking it later
	// is harmless, so a revoke that does not get through by ctx's end
	// (and doneGrace) is left to the background (giveBackWithin).
	if !time.Now().Before(ls.Deadline()) && ls.expired() {
		ls.l.giveBackWithin(ctx, ls.etcdLease(), nil)
	}
	if err := ls.errNow(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("etcdlock: extend %q: %w", ls.name, err)
	}
	c := ls.l.client
	// From the Grant's send until the move is settled, the key may end up
	// on the new etcd lease, which etcd deletes ttl after that at the
	// soonest (see capDeadline).
	sent := time.Now()
	ls.capDeadline(deadline(sent, ttl))
	// Past the lease's deadline (capped) the lease has ended: no call
	// waits longer than that, and each attempt gets attemptTimeout, then
	// goes to the next member (the Txn can be repeated: it only moves the
	// key).
	cctx, cancel := context.WithDeadline(ctx, ls.Deadline())
	defer cancel()
	// Nor once the lease has ended (a Release that could not wait for
	// this, run at a loss): its tries again after Unavailable would go on
	// until the deadline for a lease nobody holds (TestReleaseStopsSettle).
	defer context.AfterFunc(ls.ctx, cancel)()
	// The Grant's tries end with Close too (see xctx), and only with
	// Close: xctx ends with ctx as well, and its AfterFunc, run in its own
	// goroutine, could cancel gctx before ctx's end reached it through
	// cctx, turning the caller's deadline into context.Canceled
	// (TestExtendCtxEndIsCtxError).
	gctx, gcancel := context.WithCancel(cctx)
	defer gcancel()
	defer context.AfterFunc(xctx, func() {
		if context.Cause(xctx) == errLockerClosed {
			gcancel()
		}
	})()
	per := attemptTimeout(ls.ttlNow())
	var g *clientv3.LeaseGrantResponse
	err = ls.l.tryUntil(gctx, per, ls.Deadline(), func(ctx context.Context) (err error) {
		g, err = c.Grant(ctx, seconds(ttl))
		return err
	})
	if err != nil {
		return ls.extendFailed(ctx, fmt.Errorf("etcdlock: extend %q: grant: %w", ls.name, closedBy(xctx, err)))
	}
	var resp *clientv3.TxnResponse
	err = ls.l.tryUntil(cctx, per, ls.Deadline(), func(ctx context.Context) (err error) {
		resp, err = ls.moveTxn(ctx, g.ID)
		return err
	})
	if err != nil {
		// The Txn may have been applied with its reply lost, or may
		// still be on its way: revoking g would then delete the lock.
		// Settle it first, in the background once ctx has ended.
		err, bg := ls.settleBehind(ctx, cctx, settled, g, ttl, sent, fmt.Errorf("etcdlock: extend %q: %w", ls.name, err))
		held = !bg
		return err
	}
	if resp.Succeeded {
		ls.modRev = resp.Header.Revision
		return ls.moveTo(ctx, g, ttl, sent)
	}
	// The key changed since this lease last wrote it: an earlier attempt
	// of this Txn moved it (its reply lost), or it is gone.
	kv := elseKey(resp)
	switch {
	case kv != nil && kv.CreateRevision == int64(ls.token) && clientv3.LeaseID(kv.Lease) == g.ID:
		ls.modRev = kv.ModRevision
		return ls.moveTo(ctx, g, ttl, sent)
	case kv != nil && kv.CreateRevision == int64(ls.token):
		// Still this lease's key, on its etcd lease, written by nobody
		// else (no other Txn of fence moves it): not expected. Revoking g
		// is safe (no Txn of this Extend holds any more).
		ls.modRev = kv.ModRevision
		ls.l.giveBackWithin(ctx, g.ID, nil)
		return ls.extendFailed(ctx, fmt.Errorf("etcdlock: extend %q: the key's revision moved to %d behind the lease's back", ls.name, kv.ModRevision))
	}
	ls.l.giveBackWithin(ctx, g.ID, nil)
	if ls.end(ls.lostf("its key %s is gone", ls.key)) {
		ls.l.giveBackWithin(ctx, ls.etcdLease(), nil)
	}
	return ls.errNow()
}

// extendErr is err as Extend returns it: fence.ErrReleased, the Err of a
// lease released before or during the Extend, as an error that matches
// fence.ErrLeaseLost too, as fence.Lease's Extend promises once the lease
// no longer holds the lock.
func (ls *Lease) extendErr(err error) error {
	if err == fence.ErrReleased {
		return fmt.Errorf("%w: %q: %w", fence.ErrLeaseLost, ls.name, fence.ErrReleased)
	}
	return err
}

// moveTxn sends the Txn that moves the key onto the etcd lease id if it is
// still as this lease last wrote it (created at the token, modified at
// modRev), and reads the key otherwise.
func (ls *Lease) moveTxn(ctx context.Context, id clientv3.LeaseID) (*clientv3.TxnResponse, error) {
	return ls.l.client.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(ls.key), "=", int64(ls.token)),
		clientv3.Compare(clientv3.ModRevision(ls.key), "=", ls.modRev),
	).Then(clientv3.OpPut(ls.key, "", clientv3.WithLease(id))).Else(clientv3.OpGet(ls.key)).Commit()
}

// elseKey returns the key read by the Else branch of a Txn that did not
// succeed, nil if it is gone.
func elseKey(resp *clientv3.TxnResponse) *mvccpb.KeyValue {
	if len(resp.Responses) == 0 {
		return nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}

// settleMove ends an Extend whose move of the key to g got no answer
// (err): the Txn may have been applied, or may still sit in a member's
// queue and be applied later. It moves the key again, onto the etcd lease
// it is on now, in a Txn with the same comparison, tried again until it
// gets an answer (see settleTxn: while cctx, the move's, lasts, and for
// twice cleanupTimeout even if it is done; giving up on a single failure,
// a member without a leader during an election, ended a lease whose key
// was in place): that bumps the key's mod revision, so the lost Txn,
// wherever it is, can no longer apply; then g, which holds no key, is
// revoked. If the lost Txn was applied first, the key is on g: the Extend
// took effect. If etcd cannot tell this either, the key may be on g, or
// may move there later, and nobody renews g: the lease ends (lost), and
// both etcd leases are revoked, which frees the lock.
//
// Without this, a check of the key's etcd lease followed by a revoke of g
// let a Txn arriving between the two move the key onto g, and the revoke
// deleted the lock under its holder.
func (ls *Lease) settleMove(ctx, cctx context.Context, g *clientv3.LeaseGrantResponse, ttl time.Duration, sent time.Time, err error) error {
	old := ls.etcdLease()
	resp, serr := ls.settleTxn(cctx, old)
	switch {
	case serr != nil:
		if ls.end(ls.lostf("an Extend could not tell whether its key %s moved to etcd lease %x, which nobody renews (%v; then %v)", ls.key, int64(g.ID), err, serr)) {
			ls.l.giveBackWithin(ctx, ls.etcdLease(), nil)
		}
		ls.l.giveBackWithin(ctx, g.ID, nil)
		return ls.errNow()
	case resp.Succeeded:
		ls.modRev = resp.Header.Revision
		ls.l.giveBackWithin(ctx, g.ID, nil)
		return ls.extendFailed(ctx, err)
	}
	kv := elseKey(resp)
	if kv != nil && kv.CreateRevision == int64(ls.token) && clientv3.LeaseID(kv.Lease) == g.ID {
		ls.modRev = kv.ModRevision
		return ls.moveTo(ctx, g, ttl, sent)
	}
	// No Txn of this Extend can apply any more: g holds no key.
	ls.l.giveBackWithin(ctx, g.ID, nil)
	if kv != nil && kv.CreateRevision == int64(ls.token) {
		ls.modRev = kv.ModRevision
		return ls.extendFailed(ctx, err)
	}
	// The key is gone: the lock is no longer held, as a move that finds it
	// gone says (the watch may not have told, on a member that hangs).
	if ls.end(ls.lostf("its key %s is gone", ls.key)) {
		ls.l.giveBackWithin(ctx, ls.etcdLease(), nil)
	}
	return ls.errNow()
}

// settleBehind runs settleMove (its arguments are settleMove's) and waits
// for it until ctx ends, or for doneGrace if ctx had ended already (the
// move's attempts took all of it): enough for a member that answers. If
// it is not through by then (a member that hangs), the settle goes on in
// the background, with its extra grace (see settleTxn), holding ls.op,
// which it gives back once it has updated the lease as it would have
// here (the deadline moved onto g, or the lease ended as lost), and then
// reports an end (flush); a Release or Extend called meanwhile waits for
// ls.op within its own ctx, as it waits for an Extend in flight. Extend
// then returns an error that wraps ctx's and says so, which matches
// fence.ErrLeaseLost only if the lease has ended already; bg reports
// that the settle took ls.op over, and with it settled, the Extend's
// count for Locker.Close (see settleStarted), which it ends. The caller
// holds ls.op.
func (ls *Lease) settleBehind(ctx, cctx context.Context, settled chan struct{}, g *clientv3.LeaseGrantResponse, ttl time.Duration, sent time.Time, err error) (_ error, bg bool) {
	res := make(chan error)
	left := make(chan struct{}) // closed when Extend returns without the result
	l := ls.l
	go func() {
		serr := ls.settleMove(ctx, cctx, g, ttl, sent, err)
		select {
		case res <- serr:
			// Extend took the result, and gives ls.op back and counts
			// itself out itself.
		case <-left:
			ls.uncapDeadline()
			ls.unlockOp()
			// Counted out before the report: its callback may close the
			// Locker, whose Close waits for the settles to be counted
			// out (it waited for itself: TestCloseFromBackgroundSettleEnd).
			l.settleEnded(settled)
			ls.flush() // after unlockOp: see flush
		}
	}()
	done, wait := ctx.Done(), (<-chan time.Time)(nil)
	if ctx.Err() != nil {
		grace := time.NewTimer(doneGrace)
		defer grace.Stop()
		done, wait = nil, grace.C
	}
	select {
	case serr := <-res:
		return serr, false
	case <-done:
	case <-wait:
	}
	close(left)
	if lerr := ls.errNow(); lerr != nil {
		return fmt.Errorf("%w (and the Extend's ctx ended: %w)", ls.extendErr(lerr), ctx.Err()), true
	}
	return fmt.Errorf("etcdlock: extend %q: %w; the move of its key got no answer, and whether it was applied is being settled in the background, the lease held meanwhile", ls.name, ctx.Err()), true
}

// settleTxn sends settleMove's Txn, moving the key onto the etcd lease
// old, until it gets an answer. A failed attempt (timed out after
// cleanupTimeout, or any error: a member without a leader answers at once)
// is tried again, a retryInterval after the last one began at most, while
// cctx lasts (the Extend's ctx, bounded by the lease's deadline, as the
// move was) and for 2*cleanupTimeout from when it is first seen ended
// (grace): giving up ends a lease whose key may well be in place. (From
// the settle's start, the grace had passed by cctx's end when the move
// failed early, an election answering every attempt at once:
// TestSettleGraceCountsFromCtxEnd.) It stops once the lease has ended (a
// Release, run at its deadline) or the client is closed, or if old is
// gone.
func (ls *Lease) settleTxn(cctx context.Context, old clientv3.LeaseID) (*clientv3.TxnResponse, error) {
	var grace time.Time // zero until cctx is seen ended
	for {
		if ls.l.client.Ctx().Err() != nil {
			return nil, errClientClosed
		}
		began := time.Now()
		if grace.IsZero() && cctx.Err() != nil {
			grace = began.Add(2 * cleanupTimeout)
		}
		until := began.Add(cleanupTimeout)
		if !grace.IsZero() && grace.Before(until) {
			until = grace
		}
		actx, cancel := context.WithDeadline(context.WithoutCancel(cctx), until)
		resp, err := ls.moveTxn(actx, old)
		cancel()
		if err == nil {
			return resp, nil
		}
		if errors.Is(err, rpctypes.ErrLeaseNotFound) || ls.errNow() != nil || (!grace.IsZero() && !time.Now().Before(grace)) {
			return nil, err
		}
		wait := time.NewTimer(retryInterval - time.Since(began))
		select {
		case <-wait.C:
		case <-ls.ctx.Done(): // not ls.Done(), which would report an end past the deadline here, holding ls.op
		case <-ls.l.client.Ctx().Done():
		}
		wait.Stop()
	}
}

// extendFailed returns err, the error of an Extend that did not get
// through, or why the lease ended if its deadline passed meanwhile.
func (ls *Lease) extendFailed(ctx context.Context, err error) error {
	if !time.Now().Before(ls.Deadline()) && ls.expired() {
		ls.l.giveBackWithin(ctx, ls.etcdLease(), nil)
	}
	if lerr := ls.errNow(); lerr != nil {
		return lerr
	}
	return err
}

// moveTo records that Extend moved the key onto the etcd lease id of ttl,
// requested at sent, and revokes the old one. If the lease ended meanwhile
// (its deadline passed while Extend waited for etcd), it revokes id
// instead, which deletes the key nobody holds any more, and returns why
// the lease ended. The caller holds ls.op.
func (ls *Lease) moveTo(ctx context.Context, g *clientv3.LeaseGrantResponse, ttl time.Duration, sent time.Time) error {
	ls.mu.Lock()
	if err := ls.err; err != nil {
		ls.mu.Unlock()
		ls.l.giveBackWithin(ctx, g.ID, nil)
		return err
	}
	old := ls.id
	ls.id, ls.ttl = g.ID, ttl
	ls.setDeadline(deadline(sent, ttl))
	ls.granted, ls.sent = time.Duration(g.TTL)*time.Second, sent
	ls.mu.Unlock()
	select {
	case ls.moved <- struct{}{}:
	default:
	}
	ls.l.giveBackWithin(ctx, old, nil) // it holds no key now
	return nil
}

// checkGone reads, within doneGrace, whether the lease's key is still
// there as created, for a Release that fails without sending its delete
// (its ctx done): the revoke that follows deletes the key, and a Release
// retried later that finds it gone could not tell that revoke from a loss
// before the first Release (an operator's delete, an etcd lease that
// expired while its renewals hung): with the key gone here, it says lost
// (TestRetriedReleaseAfterLossNotReleased); with it there, or no answer, the revoke's
// doing. A read, no Raft commit, on a path that runs only after a failure.
// Only while the lease is held, before and after the read: a Release that
// ended it (an earlier one, or one under way that holds ls.op) ended it
// before its delete or revoke left, which may be what removed the key, and
// the key gone is then no sign of a loss (fencetest's
// ReleaseWithDoneContextTwice).
func (ls *Lease) checkGone(ctx context.Context) {
	if ls.errNow() != nil {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), doneGrace)
	defer cancel()
	resp, err := ls.l.client.Get(rctx, ls.key)
	if err == nil && (len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != int64(ls.token)) && ls.errNow() == nil {
		ls.goneBefore.Store(true)
	}
}

// releaseFailed ends the lease as released after a Release that could not
// delete the key, and revokes its etcd lease (bounded, even with ctx done),
// which deletes the key; if that does not get through either, it is tried
// again in the background (see giveBack). The lease's etcd lease is
// then never kept for reuse: only a Release that ended the lease as its
// own delete left, and that delete went through, keeps it, and this one
// ended the lease first, or took the revoke over from that Release
// (takeRevoke), or retries one that failed. held says the caller holds
// ls.op, so no Release of this lease can have kept the etcd lease
// meanwhile (it would have set ls.released); without ls.op it revokes
// only if this call ended the lease, or if a Release that holds ls.op
// ended it as its delete left and has not yet decided to keep the etcd
// lease (it then does not): past that, that Release may have handed the
// etcd lease to the next Acquire.
func (ls *Lease) releaseFailed(ctx context.Context, held bool) {
	if !ls.end(fence.ErrReleased) && !held && !ls.takeRevoke() {
		return
	}
	ls.mu.Lock()
	id := ls.id
	ls.mu.Unlock()
	// The delete may have been dropped, by a member that hangs or by the
	// cancel of its attempt: the key must not outlive the lease on an etcd
	// lease nobody renews, so the revoke is retried if it fails. Marked
	// once a revoke has got through: a later Release that finds the key
	// gone before that cannot tell this revoke from a loss (the etcd lease
	// expired, or revoked by another), and says lost.
	ls.l.giveBackWithin(ctx, id, func() { ls.revokedOnFail.Store(true) })
}

// Release deletes the lease's key if it is still the one created at the
// token and ends the lease; see fence.Lease. The lease ends as the release
// starts, before the delete is sent (Err returns fence.ErrReleased, Done is
// closed, Context is cancelled with that cause): once the delete is
// applied another Acquire may take the lock, while Release still waits for
// the reply. The end is reported to the Observer and the Logger once the
// reply is in, as released, or as lost (fence.LostRemoved) if the key was
// already gone, which Err then returns too. Release then keeps the etcd
// lease, which holds no key any more, for the Locker's next Acquire (see
// Locker.Close), or revokes it. It never deletes another key: a lease
// whose key is gone gets an error matching fence.ErrLeaseLost and deletes
// nothing. A delete that fails with gRPC's Unavailable or a dropped
// proposal (a leader change, a member's restart) is sent again after a
// back-off, within ctx and until the lease's deadline. A Release that
// fails (a done ctx, the cluster unreachable) ends the lease all the same,
// as released, and revokes its etcd lease (which is never kept), or leaves
// the key to expire with it; calling Release again retries the delete.
func (ls *Lease) Release(ctx context.Context) (result error) {
	if ctx == nil {
		return nilctx.Err("etcdlock", "Release")
	}
	// The lease stays on the Locker's list of those held until this
	// returns: a Close called while its delete is under way releases it
	// again, which waits for this (ls.op), within Close's ctx. Taken off
	// as the delete left, it was neither released by Close nor waited
	// for, and the client closed after Close cut the delete, the key left
	// for its etcd lease's TTL (TestCloseWaitsForReleaseUnderWay).
	defer func() {
		if ls.errNow() != nil {
			ls.l.forget(ls)
		}
	}()
	var settled func() // the report of the end this call settled (releasedAs)
	defer func() {
		ls.flush() // after unlockOp, and with the result settled: see flush
		if settled != nil {
			settled()
		}
	}()
	// The lease ends before the delete is sent: a ctx that its end
	// cancels (its Context, or fence.Run's fn's) must not cancel the
	// delete; it ends at the lease's deadline instead, as the lease's
	// expiry ended it before.
	ctx, stop := releasectx.Detach(ctx, ls.Deadline())
	defer stop()
	// Past its deadline the lease ends here, as Err would: before this
	// waits for an Extend under way (ls.op) or for run's renewal (join),
	// which, read late, would otherwise keep it; it then counts as lost
	// before this Release. Its etcd lease is given back, as run does. The
	// end is reported as this call returns, once its result is settled
	// (reported here, a callback's Release would wait for ls.op). Once this
	// holds ls.op and has joined run, the deadline is checked again below.
	ls.mu.Lock()
	expired := ls.expireDueLocked()
	id := ls.id
	ls.mu.Unlock()
	if expired != nil {
		defer expired() // after unlockOp, with the result settled
		ls.l.giveBackWithin(ctx, id, nil)
	}
	if err := ls.lockOp(ctx); err != nil {
		// An Extend in flight holds ls.op; it revokes the etcd lease it
		// moves the key to when it finds the lease ended. A Release in
		// flight keeps the etcd lease only if it ended the lease first
		// and this one has not taken over its revoke (see releaseFailed).
		ls.checkGone(ctx)
		ls.releaseFailed(ctx, false)
		return fmt.Errorf("etcdlock: release %q: %w", ls.name, err)
	}
	defer ls.unlockOp()
	if ls.released {
		return ls.relErr
	}
	// ended: this Release ended the lease (endReleasing) as its delete was
	// about to leave, and settles how by its result (before unlockOp and
	// flush, which reports it).
	ended := false
	defer func() {
		if ended {
			settled = ls.releasedAs(result)
		}
	}()
	// Stop run first, or it would take the delete below for a loss: once
	// halted it reports no loss (see run). On the usual path the delete is
	// sent while run winds down, and joined after; run's fields are left
	// alone until then.
	ls.halt()
	// A plain delete, not a Txn that compares the key's create revision
	// with the token: the key's name ends in the ID of the etcd lease it
	// was created on, and only an Acquire on that etcd lease creates it.
	// While this Lease holds it, that etcd lease is this Lease's alone: it
	// is kept for another Acquire only after this delete went through in
	// one attempt, so the key deleted is the one created at the token, or
	// nothing (it is gone: deleted, or its etcd lease expired or revoked,
	// which makes any Put on it fail), or an orphan this Lease's own create
	// Txn left late on its etcd lease, which is then revoked (noReuse). A
	// delete that took more than one attempt may have an attempt applied
	// late, after the next Acquire on the etcd lease made the same key
	// again: its etcd lease is revoked, never kept (see below). The
	// response's count of deleted keys tells a key already gone, as the
	// Compare did. An attempt that failed with Unavailable (a leader
	// change, a member's restart) is sent again until the lease's
	// deadline (tryUntil), as one that timed out: the etcd lease is this
	// Lease's until this returns, so a retry deletes this key or nothing,
	// even after an attempt applied with its reply lost
	// (TestReleaseDeleteUnavailable).
	var resp *clientv3.DeleteResponse
	attempts := 0
	del := func() error {
		return ls.l.tryUntil(ctx, attemptTimeout(ls.ttlNow()), ls.Deadline(), func(ctx context.Context) (err error) {
			attempts++
			if kv := ls.l.raw(); kv != nil && ls.keyb != nil {
				resp, err = deleteRaw(ctx, kv, &pb.DeleteRangeRequest{Key: ls.keyb})
				return err
			}
			resp, err = ls.l.client.Delete(ctx, ls.key)
			return err
		})
	}
	early := ctx.Err() == nil && time.Now().Before(ls.Deadline()) && ls.errNow() == nil
	var err error
	if early {
		// The lease ends before the delete leaves: once it is applied
		// another Acquire may take the lock, and this lease's Err and
		// Context must say it is over by then, not after the reply
		// (fencetest's MutualExclusion saw a grant while the releasing
		// lease still had Err nil). run, halted, takes the delete for no
		// loss; one it found before it was halted stands (see below).
		ended = ls.endReleasing()
		err = del()
	}
	ls.join()
	// Whatever happens below, nothing renews the lease any more, and the
	// lease ends: a Release that fails (a done ctx, say) revokes the etcd
	// lease, or leaves the key to expire with it, and calling Release
	// again retries the delete. (ls.watchdog stays as it was: a lease
	// past its deadline ends as not renewed, as run ends it, and Err may
	// read it meanwhile.)
	if !early {
		if !time.Now().Before(ls.Deadline()) && ls.expired() {
			ls.l.giveBackWithin(ctx, ls.etcdLease(), nil)
		}
		// Lost before Release was called; ErrReleased is an earlier
		// Release that failed, whose delete this one retries.
		if err := ls.errNow(); err != nil && err != fence.ErrReleased {
			ls.released, ls.relErr = true, err
			return err
		}
		if err := ctx.Err(); err != nil {
			ls.checkGone(ctx)
			ls.releaseFailed(ctx, true)
			return fmt.Errorf("etcdlock: release %q: %w", ls.name, err)
		}
		// Ended already, by an earlier Release that failed, unless
		// a renewal moved the deadline after early was decided.
		ended = ls.endReleasing()
		err = del()
	}
	if lerr := ls.errNow(); lerr != nil && lerr != fence.ErrReleased {
		// run found the lease lost before it was halted (its key deleted
		// by another, or its etcd lease gone): that stands.
		ls.released, ls.relErr = true, lerr
		return lerr
	}
	if err != nil {
		if attempts > 0 {
			ls.delTried.Store(true)
		}
		ls.releaseFailed(ctx, true)
		return fmt.Errorf("etcdlock: release %q: %w", ls.name, err)
	}
	// The delete got its reply: keep the etcd lease if this Release ended
	// the lease and no Release without ls.op has taken over its revoke
	// meanwhile (none can from here on).
	kept := ended && ls.mayKeep()
	var lost error
	deleted := resp.Deleted > 0
	switch {
	case !deleted && ls.goneBefore.Load():
		lost = ls.lostf("its key %s was gone before an earlier Release, which failed", ls.key)
	case !deleted && ls.revokedOnFail.Load():
		// An earlier Release that failed revoked the etcd lease, and with
		// it the key.
	case !deleted && (attempts > 1 || ls.delTried.Load()):
		// An attempt that timed out or failed with Unavailable (its
		// reply lost), of this Release or an earlier one, may have
		// deleted it. That cannot be told from a loss, and is taken for
		// a release, as by the other backends (fence.Lease's Release):
		// a caller who retries a Release that failed is not told of a
		// loss that most likely was its own delete. The etcd lease is
		// not kept (see below).
	case !deleted && attempts == 1 && kept:
		lost = ls.lostf("its key %s was already gone", ls.key)
	case !deleted:
		// No delete of this lease's was sent before this one, and its
		// revoke after a failed Release has not been confirmed: gone
		// before it, or by that revoke. A release that cannot vouch for
		// the lease says so.
		lost = ls.lostf("its key %s was gone (deleted before this Release, or by the revoke of an earlier one that failed, not yet confirmed)", ls.key)
	}
	switch {
	case lost != nil:
		// Err says so once releasedAs has the result (if this Release
		// ended the lease; else it had ended, released, before).
		ls.l.giveBackWithin(ctx, ls.etcdLease(), nil)
	case deleted && kept && !ls.noReuse && attempts == 1:
		// Our own delete went through, its lease ended as it left, and
		// no failed Release took over the revoke meanwhile: the etcd lease
		// holds no key now. Keep it for the next Acquire instead of
		// revoking it, which takes a Raft commit out of Release's path
		// and, with the Grant spared, another out of Acquire's. A lease
		// ended before (lost, expired, or by a Release that failed) never
		// gets here, nor one whose create Txn may yet be applied late, nor
		// one whose delete had an attempt time out (applied late, it would
		// delete the key the next Acquire makes on the etcd lease). Such an
		// etcd lease is stale anyway (an attempt times out after a sixth of
		// the lease time, and run, halted, renews it no more: it was sent
		// more than a tenth of the lease time ago): the rule holds even if
		// freshness is changed.
		ls.mu.Lock()
		sp := spare{id: ls.id, ttl: ls.ttl, granted: ls.granted, sent: ls.sent, old: int64(ls.token)}
		ls.mu.Unlock()
		ls.l.recycle(ctx, sp)
	default:
		ls.l.giveBackWithin(ctx, ls.etcdLease(), nil)
	}
	ls.released, ls.relErr = true, lost
	return ls.relErr
}
