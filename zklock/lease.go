package zklock

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
	"github.com/go-zookeeper/zk"
)

// lease is a lock held on ZooKeeper: its ephemeral node is the lowest in the
// lock's directory. It ends when the node is deleted or its session ends
// (the node's watch says so), when the Locker has not heard from ZooKeeper
// for a session timeout, or, for a lease with fence.TTL, when its lease time
// runs out unless extended (the lease then deletes its node itself).
type lease struct {
	l       *Locker
	a       attempt
	node    string
	version int32 // the node's data version, for the delete
	token   fence.Token
	ttl     time.Duration // zero: the session is the lease
	granted time.Time     // for the hold time reported to the Observer
	owner   int64         // the node's session (its ephemeral owner)

	// delSent: a Release that failed had sent its delete, which may have
	// run; goneBefore: the background delete after a failed Release found
	// no node. A Release retried later that finds the node gone reads
	// them (see release).
	delSent    atomic.Bool
	goneBefore atomic.Bool

	ctx    context.Context // cancelled with the lease's Err as cause when it ends
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	contact  time.Time // when the last request that ZooKeeper answered was sent
	ttlEnd   time.Time // when a fence.TTL lease runs out; zero without
	deadline time.Time
	dl       atomictime.Time // deadline's copy for Deadline, which never blocks
	// contactAt is contact's copy for Deadline, as of the last setDeadline.
	contactAt atomictime.Time
	expiry    *time.Timer
	err       error
	released  bool
	relErr    error

	relOp       chan struct{} // a token in it: a Release is under way
	stop        chan struct{} // closed by Release to stop the monitor
	stopOnce    sync.Once
	monitorDone chan struct{}
	// changed is closed at the next grant that the Locker's
	// SessionTimeouts records (nil without one): see retime.
	changed <-chan struct{}
	// logging: the monitor is logging a failed check, with no check under
	// way, and stops if Release stopped it meanwhile (see logFailed):
	// Release does not wait for it, as the Logger's handler may be what
	// calls Release.
	logging bool
}

var _ fence.Lease = (*lease)(nil)

func (l *Locker) newLease(ctx context.Context, a *attempt, node string, st *zk.Stat, watch <-chan zk.Event, ttl time.Duration, start, sent time.Time) *lease {
	ls := &lease{
		l: l, a: *a, node: node, version: st.Version, token: fence.Token(st.Czxid), ttl: ttl, owner: st.EphemeralOwner,
		contact: sent, granted: time.Now(), relOp: make(chan struct{}, 1), stop: make(chan struct{}), monitorDone: make(chan struct{}),
	}
	if ttl > 0 {
		ls.ttlEnd = sent.Add(ttl)
	}
	if l.st != nil {
		_, ls.changed = l.st.last() // before the deadline reads the timeout
	}
	ls.ctx, ls.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	ls.mu.Lock() // the timer may fire before ls.expiry is set
	defer ls.mu.Unlock()
	if l.st != nil {
		l.st.follow(ls) // a grant from now on waits for ls.mu, then retimes ls
	}
	ls.setDeadline(ls.deadlineLocked())
	ls.expiry = time.AfterFunc(time.Until(ls.deadline), ls.expire)
	go ls.monitor(watch)
	return ls
}

// deadlineLocked is the earlier of the lease time's end and a session
// timeout after the last contact, less an allowance for the clocks' rates
// (1% plus 2 ms, as redislock): ZooKeeper expires a session no sooner than
// a session timeout after it last heard from the client, which was after
// that request was sent.
func (ls *lease) deadlineLocked() time.Time {
	d := sessionBound(ls.contact, ls.timeout())
	if !ls.ttlEnd.IsZero() && ls.ttlEnd.Before(d) {
		d = ls.ttlEnd
	}
	return d
}

// sessionBound is when a session of timeout st, last heard from at
// contact, is known to live until.
func sessionBound(contact time.Time, st time.Duration) time.Time {
	return contact.Add(st - st/100 - 2*time.Millisecond)
}

// timeout is the session timeout that the lease's deadline is counted
// from: the Locker's, and with WithSessionTimeouts the lowest granted to
// the lease's session as recorded when it is read, or 0 once the
// connection has another session (the lease's has ended: go-zookeeper
// opens another only once told that one expired), which puts the
// deadline in the past.
func (ls *lease) timeout() time.Duration {
	if ls.l.st == nil {
		return ls.l.timeout()
	}
	got, session := ls.l.st.Timeout()
	if session != ls.owner {
		return 0
	}
	return min(got, ls.l.sessionTimeout)
}

// retime follows a grant that the Locker's SessionTimeouts recorded: a
// (re)connection of the lease's session, whose timeout the servers may
// have lowered, or a new session. It moves the deadline and the expiry
// timer to a timeout after the later of the last contact and the dialling
// of the connection that the session was granted on (the server heard the
// connect request, sent after that, and kept the session); if the
// connection has another session, the timeout is 0 and the timer ends the
// lease at once (see expire). The SessionTimeouts calls it at the grant,
// the monitor again when it sees the grant.
func (ls *lease) retime(g grant) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err == nil {
		if g.session == ls.owner && g.connected.After(ls.contact) {
			ls.contact = g.connected
		}
		ls.setDeadline(ls.deadlineLocked())
		ls.expiry.Reset(time.Until(ls.deadline))
	}
}

// expire ends the lease at its deadline and deletes its node: the lease
// time ran out, or ZooKeeper may have expired the session. It ends the
// lease only if its deadline has come: a reply or an Extend may have moved
// it while the timer fired (the timer, reset, fires again then).
func (ls *lease) expire() {
	ls.mu.Lock()
	report := ls.expireDueLocked()
	ls.mu.Unlock()
	if report != nil {
		report()
	}
}

// expireDueLocked ends the lease if it is held and its deadline has
// passed, as its expiry timer does (expire), and starts the deletion of
// its node. It returns the report of the end (nil: not ended here), for
// the caller to make once it has unlocked ls.mu and waits for nothing the
// callback may wait for in turn (see endAsLater). ls.mu is held (timeout
// reads the SessionTimeouts under it, as deadlineLocked does).
func (ls *lease) expireDueLocked() (report func()) {
	if ls.err != nil {
		return nil
	}
	due := ls.dueLocked()
	if time.Now().Before(due) {
		return nil
	}
	why := fmt.Errorf("%w: %q: no reply from ZooKeeper for a session timeout (%v): the session may have expired",
		fence.ErrLeaseLost, ls.a.name, ls.timeout())
	cause := fence.LostRenewFailed
	if ls.l.st != nil {
		if _, session := ls.l.st.Timeout(); session != ls.owner {
			why = fmt.Errorf("%w: %q: its session %#x ended (the connection has session %#x)",
				fence.ErrLeaseLost, ls.a.name, ls.owner, session)
			cause = fence.LostRemoved
		}
	}
	if !ls.ttlEnd.IsZero() && !ls.ttlEnd.After(due) {
		why = fmt.Errorf("%w: %q: its lease time ran out", fence.ErrLeaseLost, ls.a.name)
		cause = fence.LostExpired
	}
	ls.endLocked(why)
	ls.l.cleanup(&ls.a, ls.node)
	return func() { ls.ended(cause, why) }
}

// dueLocked is when the lease ends: its deadline, or, with
// WithSessionTimeouts, the earlier bound that the session timeout as
// recorded now gives, as Deadline reads it. A grant that lowered the
// timeout (or a new session: 0) moves Deadline at once, and the lease's
// deadline only once the SessionTimeouts has retimed it, after it
// recorded the grant: in that moment Err said held, and Release returned
// nil, past the Deadline (TestErrAgreesWithLoweredDeadline). ls.mu is
// held (contact is contactAt under it).
func (ls *lease) dueLocked() time.Time {
	d := ls.deadline
	if ls.l.st != nil {
		if b := sessionBound(ls.contact, ls.timeout()); b.Before(d) {
			d = b
		}
	}
	return d
}

func (ls *lease) Name() string       { return ls.a.name }
func (ls *lease) Token() fence.Token { return ls.token }
func (ls *lease) String() string     { return fmt.Sprintf("lease %q token %d", ls.a.name, ls.token) }

// Err, Context and Done end a lease whose deadline has passed, as its
// expiry timer does (expire), whether or not the timer's goroutine has run
// yet: in that gap (microseconds, more on a loaded machine) they said the
// lease was held, and Release deleted the node and returned nil, reported
// Released, where redislock, redlock and memlock answered the loss
// (TestObservedLeaseEndsAtDeadlineBeforeItsTimer). The end is reported by
// the call that made it, before it returns: the caller holds nothing the
// callback may wait for. (The monitor, which Release waits for, reads the
// lease's end with errNow.)
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

func (ls *lease) Context() context.Context { ls.expire(); return ls.ctx }
func (ls *lease) Done() <-chan struct{}    { ls.expire(); return ls.ctx.Done() }

// errNow is Err without the deadline's check: it ends nothing.
func (ls *lease) errNow() error { ls.mu.Lock(); defer ls.mu.Unlock(); return ls.err }

// Deadline returns the lease's deadline, counted from the session timeout
// as it is when it is read: with WithSessionTimeouts, a grant lower than
// the one the deadline was last counted from, recorded a moment ago,
// already moves it (retime moves the expiry timer too).
// It never blocks (see fence.Lease): it reads copies of the deadline and
// the last contact, which setDeadline keeps.
func (ls *lease) Deadline() time.Time {
	d := ls.dl.Load()
	if ls.l.st == nil {
		return d
	}
	if b := sessionBound(ls.contactAt.Load(), ls.timeout()); b.Before(d) {
		return b
	}
	return d
}

// setDeadline sets the deadline, under ls.mu, and the copies of it and of
// the last contact (which comes before it) that Deadline reads without it.
func (ls *lease) setDeadline(d time.Time) {
	ls.deadline = d
	ls.contactAt.Store(ls.contact)
	ls.dl.Store(d)
}

// end records why the lease ended and cancels its context; the first call
// wins and reports true. The cause it reports is Released for
// fence.ErrReleased, LostRemoved otherwise (the node was deleted, or the
// session that owned it ended); see endAsLater.
func (ls *lease) end(why error) bool {
	ended, report := ls.endLater(why)
	report()
	return ended
}

// endLater is end, but returns the report to the Observer and the Logger
// (never nil; a no-op when this call did not end the lease) rather than
// make it: see endAsLater.
func (ls *lease) endLater(why error) (ended bool, report func()) {
	cause := fence.LostRemoved
	if why == fence.ErrReleased {
		cause = fence.Released
	}
	return ls.endAsLater(why, cause)
}

// endAsLater is end with the cause to report to the Observer and the
// Logger, and returns the report rather than make it, for the caller to
// make once it waits for nothing that the callback may wait for in turn:
// the callback may call Release, which waits for the monitor to end and
// for the Release under way, whose result must be settled before the
// callback's Release returns it.
func (ls *lease) endAsLater(why error, cause fence.LeaseCause) (ended bool, report func()) {
	ls.mu.Lock()
	if ls.err != nil {
		ls.mu.Unlock()
		return false, func() {}
	}
	ls.endLocked(why)
	ls.mu.Unlock()
	return true, func() { ls.ended(cause, why) }
}

// endLocked records why the held lease ended, stops its expiry timer and
// cancels its context. ls.mu is held and ls.err is nil.
func (ls *lease) endLocked(why error) {
	ls.err = why
	ls.expiry.Stop()
	ls.cancel(why)
}

// touch records that ZooKeeper answered a request sent at sent, which moves
// the deadline.
func (ls *lease) touch(sent time.Time) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err != nil || !sent.After(ls.contact) {
		return
	}
	ls.contact = sent
	ls.setDeadline(ls.deadlineLocked())
	ls.expiry.Reset(time.Until(ls.deadline))
}

// probe is the outcome of an exists call on the lease's node.
type probe struct {
	sent   time.Time
	exists bool
	watch  <-chan zk.Event // set when the probe re-armed the watch
	err    error
}

// monitor follows the node's watch, which fires when the node is deleted
// or the session expires or the connection is closed, and checks the node
// every third of the session timeout, which moves the deadline. It does not
// read the connection's event channel: that is the user's. When it ends
// the lease, it reports the end once it is done (monitorDone closed): the
// callback told may call Release, which waits for that.
func (ls *lease) monitor(watch <-chan zk.Event) {
	report := ls.follow(watch)
	if ls.l.st != nil {
		ls.l.st.forget(ls)
	}
	close(ls.monitorDone)
	report()
}

// follow is monitor's loop; it returns the report of the lease's end when
// it ended the lease.
func (ls *lease) follow(watch <-chan zk.Event) (report func()) {
	report = func() {}
	// every is a third of the timeout, retryPause at least (a lease whose
	// session has ended has a timeout of 0, and ends at once).
	every := max(ls.timeout()/3, retryPause)
	timer := time.NewTimer(every)
	defer timer.Stop()
	var results chan probe       // non-nil while a probe is in flight
	ready := settled{seen: true} // the session just answered the grant
	changed := ls.changed
	for {
		select {
		case <-ls.stop:
			return report
		case <-ls.ctx.Done():
			return report
		case <-changed:
			var g grant
			g, changed = ls.l.st.last() // before retime reads the timeout
			if ls.retime(g); ls.stopped() {
				return report
			}
			every = max(ls.timeout()/3, retryPause)
			if results == nil {
				timer.Reset(every) // check the node a third of the (new) timeout from now
			}
		case ev := <-watch:
			watch = nil // a watch fires once
			switch ev.Type {
			case zk.EventNodeDeleted:
				_, report = ls.endLater(fmt.Errorf("%w: %q: its node %s was deleted", fence.ErrLeaseLost, ls.a.name, ls.node))
				return report
			case zk.EventNotWatching:
				_, report = ls.endLater(fmt.Errorf("%w: %q: %w", fence.ErrLeaseLost, ls.a.name, ev.Err))
				return report
			}
			// Its data changed: the next probe sets the watch again.
		case <-timer.C:
			if !ready.check(ls.l.conn) {
				// Nothing is sent while disconnected, nor right as the
				// session comes back (see awaitSession). Check again soon.
				timer.Reset(every / 4)
				continue
			}
			results = make(chan probe, 1)
			go func(rearm bool, out chan<- probe) {
				p := probe{sent: time.Now()}
				if rearm {
					// GetW: an exists-watch would stay behind if the
					// node is gone.
					_, _, p.watch, p.err = ls.l.conn.GetW(ls.node)
					p.exists = p.err == nil
					if errors.Is(p.err, zk.ErrNoNode) {
						p.err = nil
					}
				} else {
					p.exists, _, p.err = ls.l.conn.Exists(ls.node)
				}
				out <- p
			}(watch == nil, results)
		case p := <-results:
			results = nil
			switch {
			case p.err != nil:
				if !ls.logFailed(p.err) {
					return report // stopped while it logged
				}
				timer.Reset(every / 4) // try again sooner; expire ends the lease if none succeeds
				continue
			case !p.exists:
				_, report = ls.endLater(fmt.Errorf("%w: %q: its node %s was deleted", fence.ErrLeaseLost, ls.a.name, ls.node))
				return report
			}
			if p.watch != nil {
				watch = p.watch
			}
			ls.touch(p.sent)
			timer.Reset(every)
		}
	}
}

// logFailed logs a failed check of the monitor's, marked as logging, and
// reports whether the monitor may go on (false: Release stopped it, or the
// lease ended, meanwhile). The handler may call Release, which stops the
// monitor and would wait for it to return, that is for the handler: a
// deadlock. Release does not wait for a monitor marked logging, and that
// is safe: what Release waits for is a monitor that would take the delete
// of the node for a loss (its watch firing, or a check finding the node
// gone), and this one neither has a check under way (this one returned)
// nor looks at its watch again once it has seen, under ls.mu here, that
// it was stopped (Release closes ls.stop before it reads logging under
// ls.mu, so a Release that did not wait is seen). The monitor then
// returns, once the handler has. Conversely a monitor that finds itself
// stopped before it logs does not log: a Release may be waiting for it.
func (ls *lease) logFailed(err error) bool {
	if ls.l.log == nil {
		return true
	}
	ls.mu.Lock()
	if ls.stopped() {
		// A Release that read logging false waits for this goroutine.
		ls.mu.Unlock()
		return false
	}
	ls.logging = true
	ls.mu.Unlock()
	ls.checkFailed(err)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.logging = false
	return !ls.stopped()
}

// stopped reports whether Release stopped the monitor or the lease ended.
func (ls *lease) stopped() bool {
	select {
	case <-ls.stop:
		return true
	case <-ls.ctx.Done():
		return true
	default:
		return false
	}
}

// Extend checks that the node still exists, moves the deadline, and for a
// lease with fence.TTL sets its lease time to end ttl from now; see
// fence.Lease. A lease without fence.TTL lasts as long as the session, so
// ttl only has to be valid. The deadline stays within a session timeout of
// the last contact whatever ttl is. Extend waits for ZooKeeper until the
// lease's deadline at most, and then returns why the lease ended.
func (ls *lease) Extend(ctx context.Context, ttl time.Duration) error {
	if ctx == nil {
		return nilctx.Err("zklock", "Extend")
	}
	if err := fence.ValidateTTL(ttl); err != nil {
		return err
	}
	// A Release may end the lease before this or while it waits.
	released := func(err error) error {
		if err == fence.ErrReleased {
			return fmt.Errorf("%w: %q: %w", fence.ErrLeaseLost, ls.a.name, fence.ErrReleased)
		}
		return err
	}
	if err := ls.Err(); err != nil {
		return released(err)
	}
	sent := time.Now()
	// Past the deadline the lease has ended: wait no longer than that (a
	// request queued while go-zookeeper reconnects waits for a server).
	dctx, cancel := context.WithDeadline(ctx, ls.Deadline())
	defer cancel()
	var exists bool
	err := ls.l.sendable(dctx, ls.owner)
	if err == nil {
		exists, err = bounded(dctx, func() (bool, error) {
			ok, _, err := ls.l.conn.Exists(ls.node)
			return ok, err
		}, nil)
	}
	if errors.Is(err, zk.ErrSessionExpired) {
		ls.end(fmt.Errorf("%w: %q: its session ended", fence.ErrLeaseLost, ls.a.name))
		return released(ls.Err())
	}
	if err != nil {
		if !time.Now().Before(ls.Deadline()) {
			ls.expire() // if its timer has not yet
		}
		if lerr := ls.Err(); lerr != nil {
			return released(lerr)
		}
		return fmt.Errorf("zklock: extend %q: %w", ls.a.name, err)
	}
	if !exists {
		select {
		case <-ls.stop:
			// A Release is under way, or failed: the node is gone by its
			// delete (or its background clean-up), and the Release says
			// how the lease ended, not this Extend (as redlock's), unless
			// the lease was lost before. The lock is no longer this
			// lease's, which the Lease contract says with ErrLeaseLost.
			if err := ls.Err(); err != nil && err != fence.ErrReleased {
				return err
			}
			return released(fence.ErrReleased)
		default:
		}
		lost := fmt.Errorf("%w: %q: its node %s was deleted", fence.ErrLeaseLost, ls.a.name, ls.node)
		ls.end(lost)
		return ls.Err()
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err != nil {
		return released(ls.err)
	}
	if ls.ttl > 0 {
		ls.ttlEnd = sent.Add(ttl)
	}
	if sent.After(ls.contact) {
		ls.contact = sent
	}
	ls.setDeadline(ls.deadlineLocked())
	ls.expiry.Reset(time.Until(ls.deadline))
	return nil
}

// Release deletes the lease's own node, at the version it was created
// with; see fence.Lease. The lease ends as the release starts, before the
// delete is sent (Err returns fence.ErrReleased, Done is closed, Context is
// cancelled): once the node is gone the next waiter may take the lock while
// Release still waits for the reply, and work under this lease must have
// stopped by then. When the reply says the node was no longer the lease's
// (deleted, or changed by another client), Err then returns that error,
// matching fence.ErrLeaseLost, as Release does. The lease has ended
// whatever the server answers: if the delete fails (ctx ended, no server
// reachable), the node is deleted in the background, as after a failed
// Acquire, and Release returns the error; calling it again retries at
// once. The lease's end is reported to the Observer and the Logger once
// Release's result is settled and another Release may run: a Release of
// the callback returns that result.
func (ls *lease) Release(ctx context.Context) error {
	if ctx == nil {
		return nilctx.Err("zklock", "Release")
	}
	report, err := ls.release(ctx)
	report()
	return err
}

// release is Release, but returns the report of the lease's end (never
// nil; see endAsLater).
func (ls *lease) release(ctx context.Context) (report func(), _ error) {
	report = func() {}
	// The lease ends before the delete is sent: a ctx that its end
	// cancels (its Context, or fence.Run's fn's) must not cancel the
	// delete; it ends at the lease's deadline instead, as the lease's
	// expiry ended it before.
	ctx, stop := releasectx.Detach(ctx, ls.Deadline())
	defer stop()
	// One Release at a time: two at once would both try the delete, and
	// the one that found the node gone would report the lease lost.
	select {
	case ls.relOp <- struct{}{}:
	default:
		select {
		case ls.relOp <- struct{}{}:
		case <-ctx.Done():
			return report, fmt.Errorf("zklock: release %q: %w", ls.a.name, ctx.Err())
		}
	}
	defer func() { <-ls.relOp }()
	ls.mu.Lock()
	if ls.released {
		defer ls.mu.Unlock()
		return report, ls.relErr
	}
	// Past its deadline the lease ends here, as Err would: before this
	// waits for the monitor, whose check under way, answered late, would
	// otherwise keep it (see touch), and once more after (endReleasing).
	// It then counts as lost before this Release, and its node is deleted
	// in the background, as the expiry timer does. The end is reported as
	// this call returns (reported here, a callback's Release would wait
	// for this one); at most one of the two ends it, and then this call's
	// own report (releasedAs) is a no-op.
	expired := ls.expireDueLocked()
	ls.mu.Unlock()
	defer func() {
		if expired != nil {
			report = alsoReport(expired, report)
		}
	}()
	ls.stopOnce.Do(func() { close(ls.stop) })
	ls.mu.Lock()
	logging := ls.logging // checking no more: see logFailed
	ls.mu.Unlock()
	if !logging {
		<-ls.monitorDone
	}
	// The lease ends before the delete is sent: once it is in, the next
	// waiter, watching this node, may take the lock at once, while this
	// call still waits for the reply (fencetest's MutualExclusion saw a
	// grant while the releasing lease had Err nil). Its end is reported
	// once the reply says how it ended (releasedAs).
	endedHere, expiredNow, lostBefore := ls.endReleasing()
	if expiredNow != nil {
		expired = expiredNow
	}
	var err error
	sent := false // a delete was sent, and may have run whatever its reply
	if lostBefore == nil || errors.Is(lostBefore, fence.ErrReleased) {
		if err = ls.l.sendable(ctx, ls.owner); err == nil {
			sent = ctx.Err() == nil // a ctx done already sends nothing
			_, err = bounded(ctx, func() (struct{}, error) {
				return struct{}{}, ls.l.conn.Delete(ls.node, ls.version)
			}, nil)
		}
	}
	switch {
	case lostBefore != nil && !errors.Is(lostBefore, fence.ErrReleased):
		err = lostBefore // conclusive: the lease was lost before Release
	case errors.Is(err, zk.ErrSessionExpired):
		// Its node, ephemeral, ended with it.
		err = fmt.Errorf("%w: %q: its session ended", fence.ErrLeaseLost, ls.a.name)
	case errors.Is(err, zk.ErrNoNode) && !endedHere && !ls.delSent.Load() && ls.goneBefore.Load():
		// The background delete that an earlier Release left, having
		// sent nothing itself, found no node: gone before it.
		err = fmt.Errorf("%w: %q: its node %s was gone before an earlier Release, which failed", fence.ErrLeaseLost, ls.a.name, ls.node)
	case errors.Is(err, zk.ErrNoNode) && !endedHere:
		// An earlier Release failed and ended the lease: its delete may
		// have run, its reply lost, or the background one it left did.
		// That cannot be told from a loss, and is a release, as for the
		// other backends (fence.Lease's Release).
		err = nil
	case errors.Is(err, zk.ErrNoNode):
		err = fmt.Errorf("%w: %q: its node %s was deleted", fence.ErrLeaseLost, ls.a.name, ls.node)
	case errors.Is(err, zk.ErrBadVersion):
		err = fmt.Errorf("%w: %q: its node %s was changed by another client", fence.ErrLeaseLost, ls.a.name, ls.node)
	case err != nil:
		// The lease has ended whatever the server says, so its node must
		// go: unlike a Redis key it would not expire while the session
		// lives. Delete it in the background; Release again retries now.
		if sent {
			ls.delSent.Store(true)
		}
		if endedHere {
			ls.l.cleanupThen(&ls.a, ls.node, func() { ls.goneBefore.Store(true) })
			report = ls.releasedAs(nil)
		}
		return report, fmt.Errorf("zklock: release %q: %w", ls.a.name, err)
	}
	if endedHere {
		report = ls.releasedAs(err)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if !ls.released {
		ls.released, ls.relErr = true, err
	}
	return report, ls.relErr
}

// endReleasing ends the lease as Release is about to delete its node:
// Err returns fence.ErrReleased, the context is cancelled with it as its
// cause, the expiry timer is stopped. Nothing is reported yet: releasedAs
// does, once the delete's reply says how the lease ended. It reports
// whether it ended the lease, and otherwise why the lease had ended: a
// lease past its deadline ends as expired instead (expireDueLocked), and
// expired is the report of that end (nil: none).
func (ls *lease) endReleasing() (ended bool, expired func(), before error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	expired = ls.expireDueLocked()
	if ls.err != nil {
		return false, expired, ls.err
	}
	ls.endLocked(fence.ErrReleased)
	return true, nil, nil
}

// alsoReport returns a report that makes first, then then.
func alsoReport(first, then func()) func() { return func() { first(); then() } }

// releasedAs settles the end of a lease that endReleasing ended, by what
// the Release concluded, and returns its report (see endAsLater): a loss
// (the node was no longer the lease's) as LostRemoved, and Err then says
// so too; anything else as Released.
func (ls *lease) releasedAs(result error) (report func()) {
	if errors.Is(result, fence.ErrLeaseLost) {
		ls.mu.Lock()
		ls.err = result
		ls.mu.Unlock()
		return func() { ls.ended(fence.LostRemoved, result) }
	}
	return func() { ls.ended(fence.Released, fence.ErrReleased) }
}
