package etcdlock

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/fencekit/fence/internal/pause"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Defaults of Options.
const (
	DefaultPrefix      = "fence/"
	DefaultWatchdogTTL = 30 * time.Second
)

// cleanupTimeout bounds the revoke that gives up an etcd lease when Acquire
// fails, when a lease is lost or released, or when Extend moves the lock
// to a new etcd lease (in the calls that take a ctx, what is left of it
// bounds it too: see giveBackWithin). A revoke that does not get through
// in time is tried again in the background until it does (see giveBack).
const cleanupTimeout = 500 * time.Millisecond

// retryInterval paces renewals that failed for a reason other than the
// etcd lease being gone, until the local deadline.
const retryInterval = 100 * time.Millisecond

// Options configure a Locker. A nil *Options means the defaults.
type Options struct {
	// Prefix is prepended to every key; default DefaultPrefix. Prefixes
	// of Lockers on one cluster may nest ("app/" and "app/jobs/"): lock
	// "jobs" of the first then leaves out the second's keys, at the cost
	// of a listing of its keys when it meets one.
	Prefix string
	// WatchdogTTL is the lease time of leases acquired without fence.TTL;
	// the watchdog renews them every third of it. Zero means
	// DefaultWatchdogTTL. etcd counts lease times in whole seconds and
	// raises short ones to its minimum (1.5 × the election timeout, 1.5 s
	// by default), so the lock may outlive a crashed holder by up to that;
	// the lease's Deadline is measured from WatchdogTTL itself.
	WatchdogTTL time.Duration

	// Observer, if not nil, is told of every acquisition and the end of
	// every lease, with Backend "etcd"; see fence.Observer.
	Observer fence.Observer

	// Logger, if not nil, receives a warning when a lease is lost (with
	// the lock name, token and cause) and when a watchdog renewal fails.
	// Nil logs nothing. Credentials never appear in it: the lines carry
	// names, tokens, causes and errors.
	Logger *slog.Logger

	_ struct{}
}

// Locker is a fence.Locker on etcd, through the caller's client. It is safe
// for concurrent use.
type Locker struct {
	client      *clientv3.Client
	kv          pb.KVClient // under client.KV, for the create Txn; nil: use client.KV (see rawKV)
	ownKV       clientv3.KV // client.KV when kv was made: kv is used only while client.KV is still it
	prefix      string
	watchdogTTL time.Duration
	obs         fence.Observer // nil: none
	log         *slog.Logger   // nil: none

	mu     sync.Mutex
	spares []spare // etcd leases of released locks, holding no key; newest last
	// closed: Close was called. Acquire and Extend fail with
	// errLockerClosed (they start the work Close waits for: an etcd
	// lease, a settle), a lease made meanwhile is refused (see hold),
	// and a released lock's etcd lease is revoked, not kept.
	closed bool
	// drained: a Close that saw the settles it waited for through has
	// listed the revokes retried in the background to wait for; a revoke
	// that does not get through is no longer left to the background,
	// where no Close would wait for it.
	drained bool
	// givingBack: the etcd leases giveBack revokes, from its first
	// attempt on (sent from the background by a lease's run, or by Err),
	// then retries a revoke of in the background, one goroutine each,
	// whose channel is closed when the give-back ends, for Close.
	givingBack map[clientv3.LeaseID]chan struct{}
	// settling holds the Extends under way, and those whose move is
	// being settled in the background (see settleBehind), one goroutine
	// each: each channel is closed when its Extend returns, or its settle
	// ends, for Close, which waits for those under way when it is called
	// (one closed channel for all, when their count was back to 0, also
	// had Close wait for every settle that started after it, for as long
	// as they overlapped: TestCloseWaitsOnlyForSettlesUnderWay). Close
	// calls each one's cancel, which ends an Extend's wait for ls.op and
	// its Grant, with errLockerClosed (see settleStarted).
	settling map[chan struct{}]context.CancelCauseFunc
	// acquiring holds the Acquires under way, for Close, which ends their
	// calls and wait in line (the cancel, with errLockerClosed): each channel is
	// closed when its Acquire returns, its key given back, or its lease
	// made before Close came. A waiter that went on after Close waited out
	// its budget, and its give-back, sent after Close had drained, was
	// tried once: on a member that hung, its key stayed for its etcd
	// lease's TTL (TestCloseEndsWaiterWithHungMember); so did the key of
	// an Acquire whose create Txn was under way (TestCloseDuringCreateTxn).
	acquiring map[chan struct{}]context.CancelCauseFunc
	// closing holds a token while a Close runs (made by the first): a
	// Close called meanwhile waits for it, within its ctx, rather than
	// return while the other still revokes the spares it took
	// (TestConcurrentCloseWaitsForSpares).
	closing chan struct{}
	// held lists the leases not ended, which Close releases; a lease
	// made once Close was called is refused (see hold).
	held map[*Lease]struct{}

	starter starter // starts the runs of its leases
}

// maxSpares bounds the etcd leases a Locker keeps for reuse: one per lock
// it holds at once, up to this many. A Release that finds the pool full
// revokes its etcd lease instead.
const maxSpares = 64

// spare is the etcd lease of a released lock: its key was deleted, so it
// holds nothing, and it lasts at least ttl from sent (when its grant or its
// last renewal was sent), as any lease of ttl does.
type spare struct {
	id      clientv3.LeaseID
	ttl     time.Duration // the fence lease time it was granted for
	granted time.Duration // the TTL etcd granted (at least ttl)
	sent    time.Time
	// old is a revision no key the next Acquire on id makes can have:
	// its Grant's, or the create revision of the last key on it. A key
	// found on id created at or before it was not made by that Acquire
	// (see create).
	old int64
}

// fresh reports whether a spare of ttl renewed at sent may still be used:
// it has at least nine tenths of its lease time left, as much as a grant
// whose round trip took a tenth of it. The lease's deadline is measured
// from sent, so it never claims more than etcd gives.
func fresh(sent time.Time, ttl time.Duration) bool { return time.Since(sent) < ttl/10 }

// takeSpare returns a fresh spare etcd lease granted for ttl, if the Locker
// has one. Spares found too old leave the pool and are revoked in the
// background, counted for Close: they hold no key, but dropped unrevoked
// they stayed on etcd for their whole TTL, past a Close that no longer
// knew of them (TestCloseLeavesNoStaleSpare).
func (l *Locker) takeSpare(ttl time.Duration) (spare, bool) {
	l.mu.Lock()
	at := -1
	for i := len(l.spares) - 1; i >= 0; i-- {
		if sp := l.spares[i]; sp.ttl == ttl && fresh(sp.sent, ttl) {
			at = i
			break
		}
	}
	var found spare
	var stale []clientv3.LeaseID
	kept := l.spares[:0]
	for i, sp := range l.spares {
		switch {
		case i == at:
			found = sp
		case fresh(sp.sent, sp.ttl):
			kept = append(kept, sp)
		default:
			stale = append(stale, sp.id)
		}
	}
	clear(l.spares[len(kept):])
	l.spares = kept
	l.mu.Unlock()
	for _, id := range stale {
		// Off the Acquire's path, as Err's give-back: it costs the revoke
		// that Release would have made without the pool.
		counted := l.countGiveBack(id)
		go l.giveBackCounted(context.Background(), counted, id, nil, cleanupTimeout)
	}
	return found, at >= 0
}

// recycle keeps the etcd lease of a lock just released (its key deleted,
// confirmed by the delete's Txn) for the next Acquire, or revokes it if it
// is too old or the pool is full. Safety: the lease holds no key, so
// keeping it grants nobody anything; the next Acquire attaches a new key
// to it, whose create revision (the token) is new; and the old Lease
// object, ended, never uses it again (its run has stopped, Extend and
// Release see it ended, and a Release of it that fails revokes only an
// etcd lease it ended itself). Only a Release whose own delete went
// through and that ended the lease calls it: never for a lease lost,
// expired, or ended by a Release that failed.
func (l *Locker) recycle(ctx context.Context, sp spare) {
	if fresh(sp.sent, sp.ttl) {
		l.mu.Lock()
		// Closed: no Acquire will take it, and Close has revoked those
		// kept.
		if len(l.spares) < maxSpares && !l.closed {
			l.spares = append(l.spares, sp)
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
	}
	l.giveBackWithin(ctx, sp.id, nil)
}

// Close releases the leases of this Locker still held and closes the
// Locker: a Locker's leases outlive no Close, as with redlock's Close and
// etcd's concurrency.Session.Close, which revokes the session's lease and
// with it every lock it holds. Each lease held is released as its
// Release does, all at once, each within ctx: it ends as released (Err
// returns fence.ErrReleased, Done is closed, Context is cancelled with
// that cause: a fence.Lead term ends, and Lead, its next Acquire refused,
// returns), its key is deleted and its etcd lease revoked, not kept for
// reuse, so that the next in line takes the lock at once. Release of such
// a lease returns what Close's Release returned, and Extend the lease's
// Err, as after any Release; a lease found lost (its key gone) ends as
// lost, reported as any loss, but is no failure of Close's. A Release of
// Close's that fails (ctx ended, the cluster unreachable) ends the lease
// all the same, as released, and revokes its etcd lease, within ctx, the
// revoke left to the background (see below) if it does not get through;
// Close returns its error, and calling Release again retries the delete.
// A lease whose Extend is under way, or whose move is being settled in
// the background, is released once that is through (within ctx); one
// whose Release is under way stays held by that Release, which Close
// waits for (within ctx), so that the client closed after Close does not
// cut its delete.
//
// From then on Acquire fails at once with an error matching
// fence.ErrClosed and fence.ErrNotAcquired, and so does Extend, of a
// lease Close has not released yet, with fence.ErrClosed (sending
// nothing, the lease left as it was): each would start work that Close
// waits for (an etcd lease, a settle in the background), after Close had
// returned. An Extend under way that has not sent its move yet (waiting
// for another call of its lease, or for its Grant, tried again after
// Unavailable) is cut short the same way, with fence.ErrClosed, its lease
// as it was, so that Close releases that lease at once. Close waits,
// within ctx, for the Extends under way and those whose move is being
// settled in the background (an Extend whose ctx
// ended with the move unanswered; see Lease.Extend), then for the revokes
// under way (a lost lease's, sent from the background by its run or by
// Err, from their first attempt on) or being retried in the background
// (see Lease.Release; those of the settles too), so that the client can
// be closed after it without cutting them; then it revokes the etcd
// leases the Locker keeps for reuse (they hold no key) and returns the
// first error (the Releases' errors, joined, first). Each revoke is tried
// again on the next member after an attempt timeout, as every call is,
// within ctx.
//
// An Acquire under way when Close is called (waiting in line, or its
// Grant or create Txn not answered yet) gives its key back and fails with
// an error matching fence.ErrClosed and fence.ErrNotAcquired, whether it
// waited or took the lock at once; Close ends its wait in line, and the
// tries of its Grant and create Txn, and one whose take came too late (see
// the package documentation) does not try again. Close waits for those
// Acquires to return, within ctx, as for the revokes above (a give-back left to the background goes on until it
// gets through, for the next Close to wait for); one that made its lease
// before Close came returns it, released by Close. Once Close has waited
// for the settles, a revoke that does not get through in the call that
// sends it (a Release called again) is not retried in the background,
// where no Close would wait for it: its etcd lease expires on etcd within
// its TTL, holding the key until then, as once the client is closed.
// Calling Close is optional: unused, the leases held go on until released
// (a program that wants its locks held after it exits, until their etcd
// leases expire, does not call it), and the kept etcd leases expire on
// etcd within their lease time; a settle cut by the client's close ends
// its lease as lost, and a key whose revoke it cuts stays until its etcd
// lease expires. Close may be called again: it waits for a Close under
// way to return, then for what is under way. A Close whose ctx ends
// before the settles are through leaves revokes to be retried in the
// background as before, for the next Close to wait for, and the kept
// etcd leases it could not revoke stay kept, for the next Close to
// revoke. A nil ctx is refused with an error matching
// fence.ErrInvalidOption, the Locker left open and unchanged, its leases
// held.
func (l *Locker) Close(ctx context.Context) error {
	if l == nil {
		return l.made() // a zero Locker has no spare to revoke: it goes on
	}
	if ctx == nil {
		return nilctx.Err("etcdlock", "Close")
	}
	l.mu.Lock()
	l.closed = true
	for _, cancel := range l.acquiring {
		cancel(errLockerClosed)
	}
	for _, cancel := range l.settling {
		cancel(errLockerClosed)
	}
	if l.closing == nil {
		l.closing = make(chan struct{}, 1)
	}
	closing := l.closing
	held := make([]*Lease, 0, len(l.held))
	for ls := range l.held {
		held = append(held, ls)
	}
	l.mu.Unlock()
	// Released first, so that the next in line gets their locks at once,
	// and before the revokes retried in the background are listed below:
	// a release that fails leaves its revoke there.
	first := l.releaseHeld(ctx, held)
	select {
	case closing <- struct{}{}:
	default:
		// Waited for within ctx; free, taken even if ctx has ended.
		select {
		case closing <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("etcdlock: close: another Close still under way: %w", ctx.Err())
		}
	}
	defer func() { <-closing }()
	l.mu.Lock()
	settling := make([]chan struct{}, 0, len(l.settling))
	for settled := range l.settling {
		settling = append(settling, settled)
	}
	acquiring := make([]chan struct{}, 0, len(l.acquiring))
	for ended := range l.acquiring {
		acquiring = append(acquiring, ended)
	}
	l.mu.Unlock()
	left := waitAll(ctx, settling)
	if left > 0 && first == nil {
		first = fmt.Errorf("etcdlock: close: %d Extend(s) still under way or settling their move in the background: %w", left, ctx.Err())
	}
	// The Acquires under way, their wait in line ended above, give their
	// keys back: a revoke of theirs that does not get through is left to
	// the background, for the wait below.
	if n := waitAll(ctx, acquiring); n > 0 {
		left += n
		if first == nil {
			first = fmt.Errorf("etcdlock: close: %d Acquire(s) still under way or giving back their key: %w", n, ctx.Err())
		}
	}
	// Then the revokes under way or retried in the background, those of
	// the settles among them: one that holds a key (of a lease lost, or
	// whose Release failed) would be cut by the client's close, and the
	// key left for its etcd lease's whole TTL
	// (TestCloseWaitsForBackgroundRevokes).
	// Retries stop only once the settles are through: one still going on
	// may yet leave a revoke to be retried, for a Close called again to
	// wait for (TestCloseAgainWaitsForSettlesRevoke).
	l.mu.Lock()
	l.drained = l.drained || left == 0
	retrying := make([]chan struct{}, 0, len(l.givingBack))
	for _, retried := range l.givingBack {
		retrying = append(retrying, retried)
	}
	l.mu.Unlock()
	if left := waitAll(ctx, retrying); left > 0 && first == nil {
		first = fmt.Errorf("etcdlock: close: %d revoke(s) of etcd leases still retried in the background: %w", left, ctx.Err())
	}
	l.mu.Lock()
	spares := l.spares
	l.spares = nil
	l.mu.Unlock()
	var failed []spare
	for _, sp := range spares {
		// Per attempt, as every call: a revoke sent to a member that
		// hangs would wait for ever.
		err := l.try(ctx, attemptTimeout(sp.ttl), func(ctx context.Context) error {
			_, err := l.client.Revoke(ctx, sp.id)
			return err
		})
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// Kept for a Close called again: forgotten, it stayed on
			// etcd for its whole TTL (TestCloseAgainRevokesSpares).
			failed = append(failed, sp)
			if first == nil {
				first = fmt.Errorf("etcdlock: close: revoke %x: %w", int64(sp.id), err)
			}
		}
	}
	if len(failed) > 0 {
		l.mu.Lock()
		l.spares = append(l.spares, failed...)
		l.mu.Unlock()
	}
	return first
}

// releaseHeld releases the leases held, for Close, at once, each within
// ctx, and returns their Releases' errors, joined (nil: none). A lease
// that ended meanwhile other than by a Release (lost, or past its
// deadline) has nothing to release.
func (l *Locker) releaseHeld(ctx context.Context, held []*Lease) error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, ls := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ls.Err(); err != nil && err != fence.ErrReleased {
				return
			}
			// A lease found lost is no failure of Close's: its end is
			// reported as any loss is, and its Release returns it.
			if err := ls.Release(ctx); err != nil && !errors.Is(err, fence.ErrLeaseLost) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) == 0 {
		return nil
	}
	return errors.Join(errs...)
}

var _ fence.Locker = (*Locker)(nil)

// waitAll waits for every channel of chans to be closed, or for ctx to end
// first; it returns how many are still open then.
func waitAll(ctx context.Context, chans []chan struct{}) (left int) {
	for i, ch := range chans {
		select {
		case <-ch:
		case <-ctx.Done():
			for _, ch := range chans[i:] {
				select {
				case <-ch:
				default:
					left++
				}
			}
			return left
		}
	}
	return 0
}

// New returns a Locker that uses client, which the caller keeps and closes
// after the Locker's last lease has ended. A client whose KV is wrapped
// (etcd's namespace package) is best wrapped before New; one wrapped after
// is seen at the next call (see the package documentation). o may be nil.
// It returns an error matching fence.ErrInvalidOption if o.WatchdogTTL is negative,
// shorter than fence.MinTTL or longer than etcd's maximum lease TTL (9e9 s;
// Acquire and Extend refuse such a lease time too).
func New(client *clientv3.Client, o *Options) (*Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("etcdlock: %w: nil client", fence.ErrInvalidOption)
	}
	l := &Locker{client: client, kv: rawKV(client), ownKV: client.KV, prefix: DefaultPrefix, watchdogTTL: DefaultWatchdogTTL}
	if o != nil {
		l.prefix = cmp.Or(o.Prefix, DefaultPrefix)
		if err := fence.ValidateObserver(o.Observer); err != nil {
			return nil, fmt.Errorf("etcdlock: %w", err)
		}
		l.obs, l.log = o.Observer, o.Logger
		if o.WatchdogTTL != 0 {
			if err := validateTTL(o.WatchdogTTL); err != nil {
				return nil, fmt.Errorf("etcdlock: watchdog TTL: %w", err)
			}
			l.watchdogTTL = o.WatchdogTTL
		}
	}
	return l, nil
}

// escaper makes a lock name one path element: lock "a" and lock "a/b" must
// not share a key prefix.
var escaper = strings.NewReplacer("%", "%25", "/", "%2F")

// Prefix returns the key prefix under which the keys of the lock called
// name live, one per holder or waiter: Prefix(name) + the etcd lease ID in
// hexadecimal. On a Locker not made by New (nil or zero) it returns the
// one New with default options would use.
func (l *Locker) Prefix(name string) string {
	prefix := DefaultPrefix
	if l != nil && l.prefix != "" {
		prefix = l.prefix
	}
	return prefix + escaper.Replace(name) + "/"
}

// seconds is ttl in etcd's whole seconds, rounded up. (ttl + 1s - 1)/1s
// overflowed for a ttl within a second of the largest Duration, a careless
// "forever": etcd was asked for a negative TTL, raised it to its minimum
// and expired the key within seconds, while Deadline said 292 years
// (TestHugeTTL).
func seconds(ttl time.Duration) int64 {
	s := int64(ttl / time.Second)
	if ttl%time.Second != 0 {
		s++
	}
	return s
}

// maxLeaseTTL is etcd's largest lease TTL (lease.MaxLeaseTTL, in seconds):
// it refuses a Grant beyond it.
const maxLeaseTTL = 9_000_000_000

// validateTTL checks a lease time for etcd: fence.ValidateTTL, and no
// longer than etcd grants, so that it is refused before anything is sent,
// as an option out of range. The error matches fence.ErrInvalidOption.
func validateTTL(ttl time.Duration) error {
	if err := fence.ValidateTTL(ttl); err != nil {
		return err
	}
	if seconds(ttl) > maxLeaseTTL {
		return fmt.Errorf("%w: etcdlock: lease time %v is longer than etcd's maximum lease TTL, %d s", fence.ErrInvalidOption, ttl, int64(maxLeaseTTL))
	}
	return nil
}

// deadline is when a lease of ttl requested at sent is known to be held:
// etcd counts from later than sent, never earlier, for at least ttl, and
// the two clocks may run at slightly different rates (1% plus 2 ms, as
// redislock allows).
func deadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - ttl/100 - 2*time.Millisecond)
}

// Acquire takes the lock called name; see fence.Locker and the package
// documentation.
func (l *Locker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	if ctx == nil {
		return nil, nilctx.Err("etcdlock", "Acquire")
	}
	if l == nil || l.obs == nil {
		return l.acquire(ctx, name, opts...)
	}
	start := time.Now()
	lease, err := l.acquire(ctx, name, opts...)
	fence.ReportAcquire(l.obs, backend, name, start, lease, err)
	return lease, err
}

func (l *Locker) acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	if err := l.made(); err != nil {
		return nil, err
	}
	if err := fence.ValidateName(name); err != nil {
		return nil, err
	}
	o, err := fence.Apply(opts)
	if err != nil {
		return nil, err
	}
	if o.TTL != 0 {
		if err := validateTTL(o.TTL); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fence.NotAcquired(name, err)
	}
	// Counted for Close from here until it returns, not only while it
	// waits in line: a create Txn under way as Close came read the lock
	// held after Close had returned nil at once, and its give-back,
	// tried once on the client closed meanwhile, left its key for its
	// etcd lease's TTL; read free, it gave a lease (token 5) 1 s after
	// Close (TestCloseDuringCreateTxn).
	cctx, acquiring, err := l.acquireStarted(ctx)
	if err != nil {
		return nil, fence.NotAcquired(name, err)
	}
	defer l.acquireEnded(acquiring)
	ttl, watchdog := o.TTL, false
	if ttl == 0 {
		ttl, watchdog = l.watchdogTTL, true
	}
	var budget time.Time
	if o.Wait > 0 {
		budget = time.Now().Add(o.Wait)
	}

	per := attemptTimeout(ttl)
	pfx := l.Prefix(name)
	// An etcd lease kept from a lock this Locker released saves the Grant
	// (a Raft commit) on the way in, as the Revoke it replaced saved one on
	// the way out. If it was revoked behind the Locker's back, the create
	// Txn fails with ErrLeaseNotFound, having written nothing, and if a
	// restore brought back a key on it, create gives it back: grant one.
	sp, reused := l.takeSpare(ttl)
	lates := 0 // late takes in a row
	// tctx is the context of the try's calls: ctx for the first try, as
	// an Acquire without a budget has (no context or timer of its own;
	// its calls send no attempt past the budget, see tryBy); the budget
	// bounds every try after a late take too (lateErr, the
	// last late take's error, then says why the Acquire failed if the
	// budget cuts one short), so that a cluster that hangs as the late
	// reply comes does not hold Acquire until ctx ends. It is of cctx,
	// so that Close ends them too: on a cluster that answered nothing, an
	// Acquire on a ctx that never ends went on sending its Grant, and held
	// Close until Close's ctx ended (TestCloseEndsAcquireOnHungCluster).
	tctx := cctx
	var lateErr error
	for {
		if !reused {
			sp.ttl, sp.sent = ttl, time.Now()
			var g *clientv3.LeaseGrantResponse
			err = l.tryBy(tctx, per, budget, func(ctx context.Context) (err error) {
				g, err = l.client.Grant(ctx, seconds(ttl))
				return err
			})
			if err != nil {
				return nil, fence.NotAcquired(name, closedBy(cctx, budgetCut(ctx, tctx, lateErr, fmt.Errorf("etcdlock: grant: %w", err))))
			}
			sp.id, sp.granted, sp.old = g.ID, time.Duration(g.TTL)*time.Second, g.ResponseHeader.GetRevision()
		}
		lease, err := l.create(ctx, tctx, cctx, name, pfx, sp, watchdog, o.Wait, budget)
		if reused && (errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, errKeyRestored)) {
			reused = false
			continue
		}
		if errors.Is(err, errLateReply) && o.Wait > 0 && time.Until(budget) > 0 && ctx.Err() == nil {
			// A cluster too slow to answer within the lease time is not
			// sent a Grant, a Txn and a Revoke again at once: back off
			// (10 ms doubling to 1 s, jittered), within the budget.
			lates++
			lateErr = err
			paused := pause.For(cctx, min(pause.Backoff(lates), time.Until(budget)))
			if context.Cause(cctx) == errLockerClosed {
				// Not on a Locker closed meanwhile: the new etcd lease
				// and key would escape Close's wait, and the lease came
				// 1 s after Close had returned (TestCloseDuringLateTake).
				return nil, fence.NotAcquired(name, fmt.Errorf("%w; not tried again: %w", err, errLockerClosed))
			}
			if paused && time.Until(budget) > 0 {
				reused = false // a new etcd lease, a new key
				if tctx == cctx {
					var cancel context.CancelFunc
					tctx, cancel = context.WithDeadline(cctx, budget)
					defer cancel()
				}
				continue
			}
		}
		if err != nil {
			return nil, fence.NotAcquired(name, closedBy(cctx, budgetCut(ctx, tctx, lateErr, err)))
		}
		return lease, nil
	}
}

// closedBy is the error err of an Acquire whose calls ran on cctx, or of
// an Extend whose wait for ls.op or Grant did: once Close has cancelled
// cctx, errLockerClosed, with err's text but not its
// context.Canceled, which the caller would take for its own ctx's.
func closedBy(cctx context.Context, err error) error {
	if context.Cause(cctx) != errLockerClosed || errors.Is(err, errLockerClosed) {
		return err
	}
	return fmt.Errorf("%w (%v)", errLockerClosed, err)
}

// budgetCut is the error of a try after a late take (lateErr, nil for
// none) that failed with err: lateErr, saying the reply came too late, if
// the wait budget (tctx's end) rather than ctx cut it short, without
// tctx's context error, which the caller would take for its own ctx's;
// else err.
func budgetCut(ctx, tctx context.Context, lateErr, err error) error {
	if lateErr == nil || ctx.Err() != nil || tctx.Err() == nil || !errors.Is(err, tctx.Err()) {
		return err
	}
	return fmt.Errorf("%w; then no answer from etcd before the wait budget ended (%v)", lateErr, err)
}

// create creates the Acquire's key on the etcd lease sp and takes the lock,
// waiting in line if wait is not zero. It revokes sp if it fails, except
// when the create Txn found sp gone (ErrLeaseNotFound, nothing written).
// Its requests run on tctx (ctx, or ctx bounded by the wait budget for a
// try after a late take), its wait in line on cctx (ctx, which Close
// cancels with errLockerClosed) within the budget; once Close was called,
// it gives back a lock it took.
func (l *Locker) create(ctx, tctx, cctx context.Context, name, pfx string, sp spare, watchdog bool, wait time.Duration, budget time.Time) (*Lease, error) {
	ttl, per := sp.ttl, attemptTimeout(sp.ttl)
	// giveUp gives back sp when the Acquire fails: its key may exist, or
	// be created late by a create Txn sent before ctx ended. It is
	// waited for no longer than ctx and the wait budget allow (a waiter
	// that gave up at the end of its budget, a late take near it, on a
	// member that hangs: half a second past the budget before).
	giveUp := func() { l.giveBackBy(ctx, sp.id, budget) }
	key := pfx + strconv.FormatInt(int64(sp.id), 16)
	// Create the key unless an attempt that timed out did. The Then branch
	// also reads the two newest keys: at the Txn's revision the new key is
	// the newest, and the one after it is its predecessor, which a waiter
	// watches at once (one round trip, as concurrency.Mutex's Lock). A
	// retry finds the key made by the first attempt and reads the oldest.
	var resp *clientv3.TxnResponse
	attempts := 0
	var req *pb.TxnRequest
	kv := l.raw()
	if kv != nil {
		req = newCreateTxn(pfx, key, sp.id)
	}
	err := l.tryBy(tctx, per, budget, func(ctx context.Context) (err error) {
		attempts++
		if req != nil {
			resp, err = txnRaw(ctx, kv, req)
			return err
		}
		resp, err = l.client.Txn(ctx).If(
			clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
		).Then(
			clientv3.OpPut(key, "", clientv3.WithLease(sp.id)),
			clientv3.OpGet(pfx, append(clientv3.WithLastCreate(), clientv3.WithLimit(2))...),
		).Else(
			clientv3.OpGet(key),
			clientv3.OpGet(pfx, clientv3.WithFirstCreate()...),
		).Commit()
		return err
	})
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil, fmt.Errorf("etcdlock: create %s: %w", key, err)
	}
	if err != nil {
		giveUp()
		return nil, fmt.Errorf("etcdlock: create %s: %w", key, err)
	}
	rev := resp.Header.Revision
	var prev *mvccpb.KeyValue // the key just before ours, if known
	held := false
	// from is the revision prev was read at, plus one.
	from := resp.Header.Revision + 1
	if resp.Succeeded {
		kvs := resp.Responses[1].GetResponseRange().Kvs
		if len(kvs) > 1 {
			prev = kvs[1]
		}
		held = prev == nil
	} else {
		mine := resp.Responses[0].GetResponseRange().Kvs
		if len(mine) == 0 {
			giveUp()
			return nil, fmt.Errorf("etcdlock: create %s: %w", key, errors.New("the key vanished"))
		}
		if attempts == 1 || mine[0].CreateRevision <= sp.old {
			// No attempt of this Acquire made it: a restore from a
			// backup brought it back on a kept etcd lease that held it
			// when the backup was taken, with that create revision, far
			// below the tokens issued since (the token was 2 after 12,
			// whatever --bump-revision). A first attempt that failed
			// unapplied (Unavailable, as the restore broke the
			// connection) and a retry that finds the key do not say so:
			// its create revision, not above the etcd lease's last key's,
			// does (TestRestoredKeyAfterUnavailableCreate: taken for
			// its own, the token was 2 after 12 again). The give-back
			// deletes it.
			giveUp()
			return nil, fmt.Errorf("etcdlock: create %s: %w", key, errKeyRestored)
		}
		rev = mine[0].CreateRevision
		owner := resp.Responses[1].GetResponseRange().Kvs
		held = len(owner) > 0 && owner[0].CreateRevision == rev
		if len(owner) > 0 && foreign(pfx, owner[0].Key) {
			prev = owner[0] // settled below
		}
	}
	if prev != nil && foreign(pfx, prev.Key) {
		// A key of another Locker whose prefix nests under this lock's:
		// not a contender. List the lock's own keys up to ours.
		own, at, err := l.ownKeys(tctx, pfx, rev, per, budget)
		if err != nil {
			giveUp()
			return nil, fmt.Errorf("etcdlock: create %s: %w", key, err)
		}
		if len(own) == 0 || own[len(own)-1].CreateRevision != rev {
			giveUp()
			return nil, fmt.Errorf("etcdlock: create %s: %w", key, errors.New("the key vanished"))
		}
		prev, held, from = nil, len(own) == 1, at+1
		if len(own) > 1 {
			prev = own[len(own)-2]
		}
	}
	sent := sp.sent
	if !held {
		if wait == 0 {
			giveUp()
			return nil, fence.ErrHeld
		}
		// The waiter's etcd lease lasts what etcd granted, which may be
		// longer than ttl (etcd's minimum): renew it on that.
		every := max(ttl, sp.granted) / 3
		w := waiter{l: l, name: name, pfx: pfx, key: key, rev: rev, id: sp.id, ttl: ttl, every: every, renewed: sp.sent}
		if prev != nil {
			w.prev, w.from = string(prev.Key), from
		}
		var err error
		if sent, err = w.wait(cctx, budget); err != nil {
			giveUp()
			if context.Cause(cctx) == errLockerClosed {
				err = errLockerClosed
			}
			return nil, err
		}
	}
	// An attempt that timed out may yet be applied, late (it sat in a
	// member that hung): once the lock is released its Compare holds
	// again, and its Put would put an orphan key on the etcd lease. A
	// revoked etcd lease makes that Put fail; a kept one would take the
	// key, holding the lock for nobody while it is reused. Such an etcd
	// lease is never kept.
	if replied := time.Now(); !replied.Before(deadline(sent, ttl)) {
		// Taken, but past the deadline counted from the etcd lease's
		// grant or last renewal (a stalled cluster, a create Txn's
		// replies lost and sent again): the lease would be over before
		// anyone used it. Give it back (the revoke deletes the key);
		// Acquire tries again, within its budget, on a new etcd lease.
		// The key holds the lock for nobody until the revoke is through:
		// it is waited for within ctx until the budget ends, but at least
		// lateGiveBackGrace after the reply (a first try, on ctx alone,
		// may answer past the budget; the cluster that answered it late
		// is slow: with doneGrace alone, a revoke of 200 ms was cut and
		// left to the background, TestLateFirstTakeSlowGiveBackBeforeReturn).
		if budget.IsZero() {
			giveUp()
		} else {
			l.giveBackBy(ctx, sp.id, later(budget, replied.Add(lateGiveBackGrace)))
		}
		return nil, fmt.Errorf("etcdlock: create %s: %w: %v after the etcd lease was granted or renewed, past the lease's deadline (lease time %v); given back", key, errLateReply, replied.Sub(sent).Round(time.Millisecond), ttl)
	}
	var keyb []byte
	if req != nil {
		keyb = req.Compare[0].Key
	}
	// noReuse is set before the lease is listed as held: a Close called
	// from then on releases it from its own goroutine, which reads it.
	ls := l.newLease(ctx, name, key, keyb, rev, sp, watchdog, attempts > 1, sent)
	if ls == nil {
		// Close came: no lock for a Locker closed meanwhile, even one
		// that the create Txn or the wait took as it came.
		giveUp()
		return nil, errLockerClosed
	}
	return ls, nil
}

// attemptTimeout bounds one attempt of a call that try retries: a sixth of
// the lease time, at least half a second.
func attemptTimeout(ttl time.Duration) time.Duration { return max(ttl/6, 500*time.Millisecond) }

// try runs call with a timeout of per on each attempt, and again while ctx
// lasts if an attempt timed out. A member that hangs (paused, or cut off)
// keeps its connection open, and a call sent to it waits for ever;
// clientv3's round-robin balancer sends the next attempt to another member.
//
// The attempt's context is cancelled by a timer rather than given a
// deadline: a deadline travels with the request (gRPC's grpc-timeout
// header, which the member parses and arms a timer of its own for), and
// that cost an uncontended acquire+release some 20 µs more than a cancel
// (BenchmarkInterleaved). A member that hangs answers neither; the cancel
// (an RST_STREAM) ends the call on both sides as the deadline did.
//
// It gives up with errClientClosed once the client is closed: a call on a
// closed client fails with gRPC's Canceled, which clientv3's retry
// interceptor takes for a cancel of its own and sends again for some 2.5 s,
// longer than a short attempt, which would look timed out, and be tried
// again for as long as ctx lasts (for ever, with a ctx that never ends).
//
// An attempt that failed otherwise, with Unavailable too, is not sent
// again: see tryUntil and tryBy.
func (l *Locker) try(ctx context.Context, per time.Duration, call func(context.Context) error) error {
	return l.retry(ctx, per, time.Time{}, time.Time{}, call)
}

// tryUntil is try for Release's delete and Extend's calls, which also
// send again, after a back-off, an attempt that failed with Unavailable
// or a dropped proposal (see tryBy), until until, the lease's deadline
// (past it the lease is over anyway), and within ctx: a leader change or
// a member's restart does not fail them, as it does not fail an Acquire
// with a wait budget (the leader handing over dropped a Release's delete
// and an Extend's Grant, which failed at once with 9 s of the lease left:
// TestReleaseExtendRideOutLeaderTransfer). Attempts that timed out are
// sent again while ctx lasts, as try does, even past until. The calls
// are those an attempt that timed out may have applied too: a delete
// whose reply was lost leaves its retry nothing to delete, a Grant's an
// etcd lease with no key, which expires, and a move's retry finds the key
// moved. On a ctx that asks for a leader (clientv3.WithRequireLeader),
// etcd's "no leader" is returned at once, as the caller asked.
func (l *Locker) tryUntil(ctx context.Context, per time.Duration, until time.Time, call func(context.Context) error) error {
	return l.retry(ctx, per, until, time.Time{}, call)
}

// tryBy is try for a call of an Acquire whose wait budget ends at by
// (zero: none, as try). From by on it sends no attempt more: one under way
// runs to its reply or its timeout (a try already sent, as fence.Wait
// says), and one that timed out fails with errNoAnswerInBudget rather than
// be sent again for as long as ctx lasts (a create Txn applied as the only
// member was paused, its reply not sent, was sent again every 5 s, for
// ever on a ctx that never ends: TestWaiterBudgetPausedBeforeCreateReply).
// Before by, an attempt that failed with gRPC's Unavailable (the
// connection lost under it: a member killed, restarted, without a leader;
// or a proposal dropped, see isUnavailable)
// is sent again after a back-off, as one that timed out: it may have been
// applied, its reply lost ("error reading from server: EOF"), and clientv3
// sends a write again only if it never went out; a waiter keeps its place
// (TestWaiterCreateUnavailableKeepsPlace); not etcd's "no leader" on a
// ctx that asks for a leader (see leaderRequired). The calls are those an
// attempt that timed out may have applied too: the create Txn's retry
// finds its key, a Grant's leaves an etcd lease with no key, which
// expires.
func (l *Locker) tryBy(ctx context.Context, per time.Duration, by time.Time, call func(context.Context) error) error {
	return l.retry(ctx, per, by, by, call)
}

// retry is the loop of try, tryUntil and tryBy: it sends an attempt that
// failed with Unavailable again until until (zero: never), and none at
// all from budget on (zero: no budget).
func (l *Locker) retry(ctx context.Context, per time.Duration, until, budget time.Time, call func(context.Context) error) error {
	for unavailable := 0; ; {
		if l.client.Ctx().Err() != nil {
			return errClientClosed
		}
		actx, cancel := context.WithCancelCause(ctx)
		t := time.AfterFunc(per, func() { cancel(errAttemptTimedOut) })
		err := call(actx)
		t.Stop()
		timedOut := context.Cause(actx) == errAttemptTimedOut
		cancel(nil)
		if err == nil {
			return nil
		}
		if !timedOut {
			if until.IsZero() || !isUnavailable(err) || leaderRequired(ctx, err) {
				return err
			}
			unavailable++
			if ctx.Err() != nil || !l.backOff(ctx, min(pause.Backoff(unavailable), time.Until(until))) {
				if ctx.Err() == nil {
					continue // the client was closed: see above
				}
				// ctx's error, as the caller's deadline gives it
				// elsewhere, with why it was still trying
				// (TestWaiterUnavailableBounds: the last Unavailable
				// alone did not match context.DeadlineExceeded).
				return fmt.Errorf("%w (tried again after: %v)", ctx.Err(), err)
			}
			if !time.Now().Before(until) {
				if budget.IsZero() {
					return fmt.Errorf("%w (tried again until the lease's deadline)", err)
				}
				return fmt.Errorf("%w (tried again until the wait budget ended)", err)
			}
			continue
		}
		if ctx.Err() != nil {
			// Cut by its own timeout as ctx ended: ctx's error, as the
			// caller's deadline would have given it.
			return ctx.Err()
		}
		if !budget.IsZero() && !time.Now().Before(budget) {
			// Not ctx's error, which the caller would take for its own.
			return fmt.Errorf("%w (an attempt sent before it got none in %v)", errNoAnswerInBudget, per)
		}
	}
}

// leaderRequired reports whether err is etcd's "no leader" on a call whose
// ctx asks for a leader (clientv3.WithRequireLeader): the caller chose to
// fail at once without one rather than wait, and gets that error, typed
// (TestRequireLeaderKept: a Release tried again waited out its 20 s ctx).
func leaderRequired(ctx context.Context, err error) bool {
	if !errors.Is(err, rpctypes.ErrNoLeader) && !errors.Is(err, rpctypes.ErrGRPCNoLeader) {
		return false
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	return slices.Contains(md.Get(rpctypes.MetadataRequireLeaderKey), rpctypes.MetadataHasLeader)
}

// backOff waits d, or less if ctx ends or the client is closed first; it
// reports whether d passed. A back-off of up to a second held a Release
// that long after the client's close (TestClosedClientEndsUnavailableRetry).
func (l *Locker) backOff(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-l.client.Ctx().Done():
	}
	return false
}

// isUnavailable reports whether err is gRPC's Unavailable, as sent by
// etcd ("etcdserver: no leader", converted by clientv3) or by gRPC (the
// connection lost), or a proposal raft dropped, unapplied: a leader
// handing its leadership over (etcdctl move-leader, a member stopped
// gracefully) drops every proposal made on it until that ends, and etcd
// sends raft's error with code Unknown (a waiter gave up at once, with
// 30 s of budget left: TestWaiterKeepsPlaceDuringLeaderTransfer).
func isUnavailable(err error) bool {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	s, _ := status.FromError(err)
	return s.Code() == codes.Unavailable || s.Code() == codes.Unknown && s.Message() == proposalDropped
}

// proposalDropped is the text of raft's ErrProposalDropped, as etcd sends
// it.
const proposalDropped = "raft proposal dropped"

// errClientClosed is why a call on a client the user closed fails. It
// matches fence.ErrClosed: a closed client cannot be opened again, so the
// Locker grants no more leases, and fence.Lead stops campaigning on it
// instead of campaigning for as long as its ctx lasts.
var errClientClosed = fmt.Errorf("etcdlock: the etcd client was closed: %w", fence.ErrClosed)

// errLockerClosed is why Acquire and Extend fail after Locker.Close.
var errLockerClosed = fmt.Errorf("the Locker was closed: %w", fence.ErrClosed)

// errAttemptTimedOut is the cause with which try cancels an attempt that
// took longer than its timeout.
var errAttemptTimedOut = errors.New("etcdlock: attempt timed out")

// errNoAnswerInBudget is why a call of an Acquire with a wait budget fails
// once an attempt sent before the budget ended timed out after it (see
// tryBy).
var errNoAnswerInBudget = errors.New("etcdlock: no answer from etcd before the wait budget ended")

// errKeyRestored is in the error of a create whose first attempt found its
// key there already (see create).
var errKeyRestored = errors.New("the key was there before its create: a restore from a backup brought it back")

// errLateReply is in the error of a create that took the lock past the
// lease's deadline: it gives no lease (see create).
var errLateReply = fmt.Errorf("%w: the reply that took the lock came too late", fence.ErrLeaseLost) // matches fence.ErrLeaseLost: the lease ended before Acquire returned

// revokeWithin gives up the etcd lease id and with it the keys attached
// to it, within d even if ctx is done. On a closed client it returns at
// once: no revoke can be sent (see try).
func (l *Locker) revokeWithin(ctx context.Context, id clientv3.LeaseID, d time.Duration) error {
	if l.client.Ctx().Err() != nil {
		return errClientClosed
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	_, err := l.client.Revoke(ctx, id)
	return err
}

// giveBack revokes the etcd lease id of an Acquire that failed, or of a
// lease whose Release failed, as revokeWithin does (within cleanupTimeout,
// even if ctx is done). If that revoke does not get through (a member that
// hangs, a cluster cut off), it is tried again in the background until it
// does, etcd answers that the etcd lease is gone, or the client is closed:
// the request that made or kept the key on it (the create Txn, the
// waiter's renewal) may have been sent before ctx ended, cancelled or
// timed out, and be applied once the member answers again, and the key
// would then hold the lock for nobody until the etcd lease expires. Its
// TTL is no bound for the retries: only a leader expires etcd leases, and
// a new leader gives each its whole TTL again (a cluster that lost its
// quorum for longer than the TTL still has it when the quorum is back).
// One give-back retries per etcd lease: a call that finds one under way
// for id (a Release retried while the cluster hangs) tries once and
// leaves the retries to it, which do not call its revoked. revoked, if
// not nil, is called once a revoke has got through. Once a Close has
// drained, the revoke is tried once, not in the background (see
// countGiveBack). It returns the first revoke's error.
func (l *Locker) giveBack(ctx context.Context, id clientv3.LeaseID, revoked func()) error {
	return l.giveBackFirstWithin(ctx, id, revoked, cleanupTimeout)
}

// giveBackFirstWithin is giveBack with its first revoke bounded by first
// rather than cleanupTimeout (the retries in the background are not).
func (l *Locker) giveBackFirstWithin(ctx context.Context, id clientv3.LeaseID, revoked func(), first time.Duration) error {
	return l.giveBackCounted(ctx, l.countGiveBack(id), id, revoked, first)
}

// countGiveBack counts a give-back of id for Close from its first revoke
// on, not only once it is retried: one sent from the background (a lost
// lease's run, Err) is under way as Close is called, and the client's
// close would cut it (TestCloseWaitsForRunsRevoke). It returns the channel
// that giveBackCounted closes as the give-back ends, or nil, counting
// nothing, if one of id is under way (it retries if need be) or once Close
// has drained (Close no longer waits for a retry started now, and the
// client is closed after it: TestReleaseAfterCloseLeavesNoRetry).
func (l *Locker) countGiveBack(id clientv3.LeaseID) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, running := l.givingBack[id]; running || l.drained {
		return nil
	}
	if l.givingBack == nil {
		l.givingBack = make(map[clientv3.LeaseID]chan struct{})
	}
	counted := make(chan struct{})
	l.givingBack[id] = counted
	return counted
}

// giveBackCounted is giveBackFirstWithin for a give-back that
// countGiveBack counted (counted, its channel), or did not (nil: the
// revoke is tried once only).
func (l *Locker) giveBackCounted(ctx context.Context, counted chan struct{}, id clientv3.LeaseID, revoked func(), first time.Duration) error {
	// try revokes once, within d, and reports whether that settles it.
	try := func(ctx context.Context, d time.Duration) (bool, error) {
		err := l.revokeWithin(ctx, id, d)
		if err == nil && revoked != nil {
			revoked()
		}
		return err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, errClientClosed), err
	}
	ended := func() {
		l.mu.Lock()
		delete(l.givingBack, id)
		close(counted)
		l.mu.Unlock()
	}
	settled, err := try(ctx, first)
	if counted == nil {
		return err
	}
	if settled {
		ended()
		return err
	}
	go func() {
		defer ended()
		closed := l.client.Ctx().Done()
		pause := time.NewTimer(retryInterval)
		defer pause.Stop()
		for wait := retryInterval; ; wait = min(2*wait, time.Second) {
			select {
			case <-closed:
				return
			case <-pause.C:
			}
			if settled, _ := try(context.Background(), cleanupTimeout); settled {
				return
			}
			pause.Reset(wait)
		}
	}()
	return err
}

// settleStarted and settleEnded count an Extend under way, and then the
// goroutine of settleBehind's that takes over from it: settleStarted
// returns a context of ctx that Close cancels with errLockerClosed (the
// Extend waits for ls.op and sends its Grant on it, not its move), and
// the channel that settleEnded closes, or errLockerClosed once Close was
// called, counting nothing (TestExtendAfterClose).
func (l *Locker) settleStarted(ctx context.Context) (context.Context, chan struct{}, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, nil, errLockerClosed
	}
	if l.settling == nil {
		l.settling = make(map[chan struct{}]context.CancelCauseFunc)
	}
	xctx, cancel := context.WithCancelCause(ctx)
	settled := make(chan struct{})
	l.settling[settled] = cancel
	return xctx, settled, nil
}

// acquireStarted and acquireEnded count an Acquire under way, for Close:
// acquireStarted returns a context of ctx that Close cancels with
// errLockerClosed, and the channel that acquireEnded closes once the
// Acquire returns (its key given back, or its lease made), or
// errLockerClosed once Close was called, counting nothing.
func (l *Locker) acquireStarted(ctx context.Context) (context.Context, chan struct{}, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, nil, errLockerClosed
	}
	if l.acquiring == nil {
		l.acquiring = make(map[chan struct{}]context.CancelCauseFunc)
	}
	wctx, cancel := context.WithCancelCause(ctx)
	ended := make(chan struct{})
	l.acquiring[ended] = cancel
	return wctx, ended, nil
}

func (l *Locker) acquireEnded(ended chan struct{}) {
	l.mu.Lock()
	cancel := l.acquiring[ended]
	delete(l.acquiring, ended)
	close(ended)
	l.mu.Unlock()
	cancel(nil)
}

// hold lists ls as held, for Close to release, and reports whether it
// did: once Close was called it lists nothing, as Close may have taken
// its list already.
func (l *Locker) hold(ls *Lease) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	if l.held == nil {
		l.held = make(map[*Lease]struct{})
	}
	l.held[ls] = struct{}{}
	return true
}

// forget takes an ended lease off the list of those held.
func (l *Locker) forget(ls *Lease) {
	l.mu.Lock()
	delete(l.held, ls)
	l.mu.Unlock()
}

func (l *Locker) settleEnded(settled chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.settling[settled](nil)
	delete(l.settling, settled)
	close(settled)
}

// giveBackWithin is giveBack for a caller that must return by ctx's
// deadline: its first revoke is bounded by what is left of ctx, and by
// doneGrace once ctx has ended, rather than by cleanupTimeout; if it does
// not get through in time, the retries go on in the background until one
// does. (A member that hangs held an Acquire that failed at its deadline
// up to cleanupTimeout longer: TestAcquireGiveBackWithinCallersDeadline.)
func (l *Locker) giveBackWithin(ctx context.Context, id clientv3.LeaseID, revoked func()) {
	l.giveBackWithinBy(ctx, id, revoked, time.Time{})
}

// giveBackBy is giveBackWithin for a failed Acquire with a wait budget
// ending at budget (zero: none): its first revoke is bounded by that too.
func (l *Locker) giveBackBy(ctx context.Context, id clientv3.LeaseID, budget time.Time) {
	l.giveBackWithinBy(ctx, id, nil, budget)
}

func (l *Locker) giveBackWithinBy(ctx context.Context, id clientv3.LeaseID, revoked func(), by time.Time) {
	first := cleanupTimeout
	if dl, ok := ctx.Deadline(); ok {
		first = min(first, time.Until(dl))
	}
	if !by.IsZero() {
		first = min(first, time.Until(by))
	}
	if ctx.Err() != nil || first < doneGrace {
		first = doneGrace
	}
	_ = l.giveBackFirstWithin(ctx, id, revoked, first)
}

// lateGiveBackGrace is how long after a late reply an Acquire with a wait
// budget waits for that take's give-back at least, even past its budget
// (within ctx): as redislock's.
const lateGiveBackGrace = 250 * time.Millisecond

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// doneGrace is how long giveBackWithin waits for a revoke once the
// caller's ctx has ended: enough for a member that answers (a revoke
// takes about a millisecond), so that the key is gone when Acquire
// returns, and short against a caller's deadline.
const doneGrace = 100 * time.Millisecond

// waiter is an Acquire waiting in line: its key exists, and keys created
// before it do too.
type waiter struct {
	l    *Locker
	name string
	pfx  string
	key  string // the waiter's own key, created at rev
	rev  int64
	id   clientv3.LeaseID
	ttl  time.Duration
	// every is how often the waiter renews its etcd lease and checks its
	// place again: a third of the TTL etcd granted.
	every time.Duration
	// renewed is when the etcd lease's grant or last renewal was sent.
	renewed time.Time
	// prev, if set, is the key just before the waiter's, read at from-1 by
	// the create Txn: the first wait watches it without checking again.
	prev string
	from int64
}

// errLostWhileWaiting is why a waiter whose own key vanished gives up.
func (w *waiter) lost(why string) error {
	return fmt.Errorf("%w: %q: the waiter's key %s %s", fence.ErrLeaseLost, w.name, w.key, why)
}

// wait waits until the waiter's key is the oldest under its prefix, the
// budget (zero: none) runs out, ctx ends, or the waiter's own key goes. It
// watches only the key created just before its own, so a release wakes
// only the next in line. It keeps the waiter's etcd lease alive meanwhile,
// and on success returns when its grant or last renewal was sent, from
// which the lease's deadline is measured, renewing it once more first
// unless that was less than a tenth of the lease time ago.
func (w *waiter) wait(ctx context.Context, budget time.Time) (time.Time, error) {
	wctx, cancel := context.WithCancel(ctx)
	if !budget.IsZero() {
		wctx, cancel = context.WithDeadline(ctx, budget)
	}
	defer cancel()
	why := func(err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if wctx.Err() != nil {
			return fence.ErrHeld
		}
		return err
	}
	c := w.l.client
	renew := time.NewTimer(w.every)
	defer renew.Stop()
	for {
		if w.prev != "" {
			prev, from := w.prev, w.from
			w.prev = ""
			if err := w.watchPrev(wctx, prev, from, renew); err != nil {
				return time.Time{}, why(err)
			}
			continue
		}
		// Check that our key is still there and find the one before it,
		// in one round trip.
		var resp *clientv3.TxnResponse
		err := w.l.tryBy(wctx, attemptTimeout(w.ttl), budget, func(ctx context.Context) (err error) {
			resp, err = c.Txn(ctx).If(
				clientv3.Compare(clientv3.CreateRevision(w.key), "=", w.rev),
			).Then(
				clientv3.OpGet(w.pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(w.rev-1))...),
			).Commit()
			return err
		})
		if err != nil {
			return time.Time{}, why(fmt.Errorf("etcdlock: wait: %w", err))
		}
		if !resp.Succeeded {
			return time.Time{}, w.lost("is gone (its etcd lease expired or was revoked)")
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		at := resp.Header.Revision
		if len(kvs) > 0 && foreign(w.pfx, kvs[0].Key) {
			// Another Locker's key, under a prefix that nests: the one
			// before ours is the newest of the lock's own keys.
			own, rev, err := w.l.ownKeys(wctx, w.pfx, w.rev-1, attemptTimeout(w.ttl), budget)
			if err != nil {
				return time.Time{}, why(fmt.Errorf("etcdlock: wait: %w", err))
			}
			kvs, at = own[max(0, len(own)-1):], rev
		}
		if len(kvs) == 0 {
			// The check just confirmed the key, so the etcd lease was not
			// revoked before it; renewed at w.renewed, it lasts ttl from
			// then. A recent renewal spares a KeepAliveOnce.
			if fresh(w.renewed, w.ttl) {
				return w.renewed, nil
			}
			sent := time.Now()
			err := w.l.tryBy(wctx, attemptTimeout(w.ttl), budget, func(ctx context.Context) error {
				_, err := c.KeepAliveOnce(ctx, w.id)
				return err
			})
			if err != nil {
				if errors.Is(err, rpctypes.ErrLeaseNotFound) {
					return time.Time{}, w.lost("has no etcd lease any more")
				}
				return time.Time{}, why(fmt.Errorf("etcdlock: renew: %w", err))
			}
			return sent, nil
		}
		if err := w.watchPrev(wctx, string(kvs[0].Key), at+1, renew); err != nil {
			return time.Time{}, why(err)
		}
	}
}

// watchPrev waits for the delete of prev, read at from-1, or for the next
// renewal; see waitDelete. Both watches start from the revision the key
// was read at: a compaction between the two ends them, and the next check
// starts them again.
func (w *waiter) watchPrev(wctx context.Context, prev string, from int64, renew *time.Timer) error {
	c := w.l.client
	rev := clientv3.WithRev(from)
	own, stopOwn := watchAsync(wctx, c, w.key, rev, clientv3.WithFilterPut())
	pc, stopPrev := watchAsync(wctx, c, prev, rev, clientv3.WithFilterPut())
	err := w.waitDelete(wctx, pc, own, renew)
	stopPrev()
	stopOwn()
	return err
}

// watchAsync calls c.Watch in a goroutine and passes its responses on:
// Watch itself blocks until a member confirms the watch, and a member that
// hangs never does, which must not stop the waiter from renewing its etcd
// lease and checking again. stop ends the watch and waits for the
// goroutine.
func watchAsync(ctx context.Context, c *clientv3.Client, key string, opts ...clientv3.OpOption) (_ <-chan clientv3.WatchResponse, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan clientv3.WatchResponse)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		for wr := range c.Watch(ctx, key, opts...) {
			select {
			case out <- wr:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, func() { cancel(); <-done }
}

// waitDelete waits for a delete on prev, keeping the waiter's etcd lease
// alive, and fails if the waiter's own key is deleted. It also returns,
// for a check, after each renewal of the waiter's etcd lease (every third
// of the TTL etcd granted it).
func (w *waiter) waitDelete(wctx context.Context, prev, own <-chan clientv3.WatchResponse, renew *time.Timer) error {
	for {
		select {
		case <-wctx.Done():
			return wctx.Err()
		case wr, ok := <-prev:
			if wctx.Err() != nil {
				return wctx.Err()
			}
			if ok && wr.CompactRevision != 0 {
				return nil // compacted before the watch started: check again
			}
			if !ok || wr.Err() != nil {
				return fmt.Errorf("etcdlock: wait: watch of the previous key ended: %v", wr.Err())
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return nil
				}
			}
		case wr, ok := <-own:
			if wctx.Err() != nil {
				return wctx.Err()
			}
			if ok && wr.CompactRevision != 0 {
				return nil // compacted before the watch started: check again
			}
			if !ok || wr.Err() != nil {
				return fmt.Errorf("etcdlock: wait: watch of the waiter's key ended: %v", wr.Err())
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return w.lost("was deleted")
				}
			}
		case <-renew.C:
			rctx, cancel := context.WithTimeout(wctx, attemptTimeout(w.ttl))
			sent := time.Now()
			_, err := w.l.client.KeepAliveOnce(rctx, w.id)
			cancel()
			if err == nil {
				w.renewed = sent
			}
			switch {
			case errors.Is(err, rpctypes.ErrLeaseNotFound):
				return w.lost("has no etcd lease any more")
			case err != nil:
				renew.Reset(retryInterval)
			default:
				// Check again, in case a watch sits on a member that
				// hangs and would never deliver the delete.
				renew.Reset(w.every)
				return nil
			}
		}
	}
}

// foreign reports whether key, under the lock prefix pfx, belongs to
// another Locker whose Prefix nests under pfx ("app/" and "app/jobs/": lock
// "jobs" of the first has the prefix "app/jobs/", under which the second
// keeps every lock): the lock's own keys hold no "/" after pfx (the etcd
// lease ID in hexadecimal), every other Locker's key does (it ends in "/"
// and an ID).
func foreign(pfx string, key []byte) bool {
	return len(key) >= len(pfx) && bytes.IndexByte(key[len(pfx):], '/') >= 0
}

// ownKeys lists the keys of the lock under pfx created at or before
// maxRev, oldest first, without those of other Lockers (see foreign), and
// the revision it read them at, trying as tryBy does (by: the wait
// budget's end, zero for none). Only a lock whose prefix another Locker's
// nests under needs it.
func (l *Locker) ownKeys(ctx context.Context, pfx string, maxRev int64, per time.Duration, by time.Time) ([]*mvccpb.KeyValue, int64, error) {
	var resp *clientv3.GetResponse
	err := l.tryBy(ctx, per, by, func(ctx context.Context) (err error) {
		resp, err = l.client.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(maxRev),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	own := resp.Kvs[:0]
	for _, kv := range resp.Kvs {
		if !foreign(pfx, kv.Key) {
			own = append(own, kv)
		}
	}
	return own, resp.Header.Revision, nil
}

// IsOwner returns a comparison for a Txn on lease's etcd cluster that
// holds only while lease's key still exists as created at lease.Token(),
// that is while the lease still owns its lock: etcd's Mutex.IsOwner idea. A
// Txn guarded by it cannot write for a holder whose lock has expired,
// been released or been deleted, however late the Txn arrives. It returns
// an error matching fence.ErrInvalidOption if lease is not from an
// etcdlock Locker's Acquire (nil, a zero Lease, another backend's).
func IsOwner(lease fence.Lease) (clientv3.Cmp, error) {
	ls, ok := lease.(*Lease)
	if !ok {
		return clientv3.Cmp{}, fmt.Errorf("etcdlock: %w: %T is not an etcdlock lease", fence.ErrInvalidOption, lease)
	}
	if ls == nil || ls.token <= 0 || ls.key == "" {
		return clientv3.Cmp{}, fmt.Errorf("etcdlock: %w: a Lease not returned by Acquire (nil or zero)", fence.ErrInvalidOption)
	}
	return clientv3.Compare(clientv3.CreateRevision(ls.key), "=", int64(ls.token)), nil
}

// made refuses a Locker that New did not make (a zero Locker, or a nil
// one): it has nothing to lock with, and Acquire panicked on it.
func (l *Locker) made() error {
	if l == nil || l.client == nil {
		return fmt.Errorf("%w: etcdlock: a Locker not made by New (zero or nil): use etcdlock.New", fence.ErrInvalidOption)
	}
	return nil
}
