package redislock

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/fencekit/fence/internal/pause"
	"github.com/fencekit/fence/internal/redisconn"
	"github.com/fencekit/fence/internal/resend"
	"github.com/redis/go-redis/v9"
)

// Defaults for Options.
const (
	DefaultPrefix         = "fence"
	DefaultWatchdogTTL    = 30 * time.Second
	DefaultTokenRetention = 24 * time.Hour
)

// Options configure a Locker. The zero value (or nil) gives the defaults.
type Options struct {
	// Prefix starts every key and channel fence writes, followed by the
	// lock name in braces: "fence:{lock:payment:1001}". Default "fence".
	Prefix string

	// WatchdogTTL is the lease time of leases acquired without fence.TTL;
	// the watchdog renews them every third of it. Default 30 s.
	WatchdogTTL time.Duration

	// TokenRetention is how long the last-token record of a lock name lives
	// after its last acquisition (at least the lease time). Tokens stay
	// increasing after it expires because their floor is the server's
	// clock. Default 24 h.
	TokenRetention time.Duration

	// ReplicaSync confirms acquisitions and renewals with WAIT; see
	// ReplicaSync. On by default.
	ReplicaSync ReplicaSync

	// Observer, if not nil, is told of every acquisition, the end of
	// every lease and every replica-sync refusal, with Backend "redis";
	// see fence.Observer.
	Observer fence.Observer

	// Logger, if not nil, receives a warning when a lease is lost (with
	// the lock name, token and cause), when a watchdog renewal fails and
	// when too few replicas acknowledge an acquisition or renewal. Nil
	// logs nothing. Credentials never appear in it: the lines carry names,
	// tokens, counts and errors.
	Logger *slog.Logger

	_ struct{} // forbids positional literals
}

// Locker grants fenced leases on Redis. It is safe for concurrent use and
// needs no closing: the goroutines it starts belong to a waiting Acquire or
// to a watchdog lease, and end with them.
type Locker struct {
	client    redis.UniversalClient // nil on a Conn
	conn      redisconn.Conn        // nil on go-redis (see conn.go)
	prefix    string
	watchdog  time.Duration
	retention time.Duration
	sharded   bool // sharded pub/sub (Redis Cluster)
	// bothWays: a cluster client given its slots (ClusterOptions's
	// ClusterSlots, as redis.NewFailoverClusterClient builds one), whose
	// servers need not be a cluster's: Lockers of plain clients may share
	// them, and publish and subscribe the unsharded way. Its scripts
	// publish both ways and it subscribes both ways (see publishMode).
	bothWays bool
	sync     ReplicaSync
	// syncUnfit, if not nil, refuses every try that needs a WAIT: the
	// client's read timeout leaves no room for one (see syncWithin).
	syncUnfit error
	// opaque: client is a UniversalClient of a type New cannot tell for a
	// single server's (see opaqueClient); with replica sync its first
	// synced call asks the server whether it is a cluster node, and then
	// probe holds the answer (see hiddenCluster).
	opaque bool
	probe  clusterProbe
	// notCluster, once set, is the refusal of a *redis.ClusterClient
	// whose servers are not in cluster mode (see clusterReplicas): kept,
	// as a hidden cluster's is, so that later tries do not ask again.
	notCluster atomic.Pointer[error]
	replicas   replicaCounts
	obs        fence.Observer // nil: none
	log        *slog.Logger   // nil: none
	calls      callers        // where bounded runs the calls it may leave
	names      nameCache      // the keys of recently used lock names
	retainArg  boxedMs        // retention ms, boxed, for the acquire script
	ttlArg     boxedMs        // the last lease ms boxed for the acquire script
	waitArg    boxedMs        // the last wait ms boxed for the acquire script

	// Replica sync's pipelines on client, reused, and WAIT's arguments,
	// the last ones built (evalPipelined).
	pipes sync.Pool
	wait  atomic.Pointer[waitCmdArgs]

	// Script calls batched on client (batch.go): those without WAIT, and
	// those with it.
	batch, syncBatch batcher

	// resendAfter: a try that took this long may have been sent twice
	// (zero: never; see resendAfter).
	resendAfter time.Duration
	// resends: the client sends a command again after a lost reply, so a
	// refused connection may end the resends of a copy that ran (see
	// mayRunLate).
	resends bool
	// parking holds the give-backs that a refused connection stopped.
	parking parking
	// giveBacks counts the give-backs running in the background (see
	// WaitGiveBacks).
	giveBacks inflight

	mu            sync.Mutex
	subscriptions map[string]*subscription // release channel → subscription
	// joining holds the owners of this Locker's waiting Acquires that may
	// be queued and have not joined their subscription yet: a grant to one
	// of them that comes first is kept for it (subscription.recent); one to
	// any other owner that waits nowhere here is not kept. Guarded by mu.
	joining map[string]struct{}
}

var _ fence.Locker = (*Locker)(nil)

// New returns a Locker on client: a *redis.Client, a Sentinel failover client,
// a *redis.ClusterClient or a *redis.Ring. It needs Redis 7.0 or newer. opts
// may be nil. New sends nothing to Redis. It returns an error matching
// fence.ErrInvalidOption when client is nil, when it is a type of the
// caller's that embeds a cluster client or a Ring (pass that client
// itself), when it is a go-redis AutoPipeliner and replica sync is on
// (pass the client it pipelines for), or when an option is out of range.
//
// A client of a type New cannot identify (a struct of the caller's that
// embeds the redis.UniversalClient interface, say) may hide a cluster
// client or a Ring, which would send replica sync's WAIT to a node of its
// own choosing: with replica sync on, the Locker's first synced call asks
// (one round trip, again every 10 s while the answer is one server)
// whether the server is a cluster node and whether keys reach more than
// one server, and if so every acquisition is refused with a
// *HiddenClusterError.
//
// A Ring keeps each lock name on one shard, and replica sync runs on that
// shard, but it gives up mutual exclusion when it reshards: see "Ring" in
// the package documentation.
func New(client redis.UniversalClient, opts *Options) (*Locker, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: redislock: nil client", fence.ErrInvalidOption)
	}
	if v := reflect.ValueOf(client); v.Kind() == reflect.Pointer && v.IsNil() {
		// var c *redis.Client; New(c, nil): an interface holding a nil
		// pointer, which would panic at the first command.
		return nil, fmt.Errorf("%w: redislock: nil client (%T)", fence.ErrInvalidOption, client)
	}
	switch client.(type) {
	case *redis.Client, *redis.ClusterClient, *redis.Ring:
	case interface{ Options() *redis.ClusterOptions }, interface{ Options() *redis.RingOptions }:
		// A type of the caller's that embeds a cluster client or a Ring:
		// the Locker would take it for one server, and send replica
		// sync's key-less WAIT through it, which routes it to a node or
		// shard of its own choosing, not on the connection that ran the
		// script (TestWrappedClusterClient: acquisitions confirmed with
		// the slot master's replica paused).
		return nil, fmt.Errorf("%w: redislock: %T wraps a cluster client or a Ring, which the Locker must see as such (it sends WAIT, and subscribes, by the slot's or shard's node): pass the *redis.ClusterClient or *redis.Ring itself",
			fence.ErrInvalidOption, client)
	case *redis.AutoPipeliner:
		// go-redis's AutoPipeliner (Client.AutoPipeline,
		// ClusterClient.AutoPipeline, Ring.AutoPipeline) tells neither
		// the client it pipelines for nor its read timeout: one of a
		// cluster client carried replica sync's key-less WAIT to a node
		// of the cluster's choosing, and acquisitions were confirmed
		// with the slot master's replica paused
		// (TestClusterBehindOtherUniversalClients). With replica sync
		// off there is no WAIT to misroute, as before.
		if opts == nil || !opts.ReplicaSync.Disabled {
			return nil, fmt.Errorf("%w: redislock: a *redis.AutoPipeliner hides the client it pipelines for, which replica sync must see (it sends WAIT on the connection that ran the script, within that client's read timeout): pass the *redis.Client, *redis.ClusterClient or *redis.Ring itself (the Locker batches its own calls), or disable replica sync",
				fence.ErrInvalidOption)
		}
	}
	return newLocker(client, nil, opts)
}

// newLocker returns a Locker on client, or on conn when client is nil.
func newLocker(client redis.UniversalClient, conn redisconn.Conn, opts *Options) (*Locker, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if err := fence.ValidateObserver(o.Observer); err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	l := &Locker{
		client:        client,
		conn:          conn,
		prefix:        cmp.Or(o.Prefix, DefaultPrefix),
		watchdog:      cmp.Or(o.WatchdogTTL, DefaultWatchdogTTL),
		retention:     cmp.Or(o.TokenRetention, DefaultTokenRetention),
		subscriptions: make(map[string]*subscription),
		joining:       make(map[string]struct{}),
		sync:          o.ReplicaSync,
		replicas:      replicaCounts{now: time.Now, nodes: make(map[string]*nodeReplicas)},
		obs:           o.Observer,
		log:           o.Logger,
	}
	if err := l.sync.check(); err != nil {
		return nil, err
	}
	if err := l.syncWithin(client); err != nil {
		return nil, err
	}
	if cc, ok := client.(*redis.ClusterClient); ok {
		l.sharded = true
		l.bothWays = cc.Options().ClusterSlots != nil
	}
	l.opaque = opaqueClient(client)
	if conn != nil {
		l.calls.selfBounded = conn.SelfBounded()
	} else {
		l.calls.selfBounded = selfBounded(client)
		l.resendAfter = resend.After(client)
		_, retries := resend.ReadTimeout(client)
		l.resends = retries > 0 || l.opaque
	}
	if strings.ContainsAny(l.prefix, "{}") || fence.ValidateName(l.prefix) != nil {
		return nil, fmt.Errorf("%w: redislock: prefix %q must be a valid lock name", fence.ErrInvalidOption, l.prefix)
	}
	if err := fence.ValidateTTL(l.watchdog); err != nil {
		return nil, fmt.Errorf("redislock: watchdog TTL: %w", err)
	}
	if l.retention < 0 {
		return nil, fmt.Errorf("%w: redislock: negative token retention %v", fence.ErrInvalidOption, l.retention)
	}
	return l, nil
}

// keys are the Redis keys of one lock name. They share the hash tag {name},
// so on a cluster they live in one slot and one script can touch them all.
// They are built once per name and shared, read-only, by the name's
// acquisitions (see nameCache).
type keys struct {
	lock    string // holds the owner id, with the lease's expiry
	token   string // the last token issued
	channel string // where the release script grants the lock to waiters
	queue   string // the owners waiting, in arrival order (see grant.lua)
	waiting string // set by waiters of older versions: the release script publishes "released" for them

	waiters string // each waiting owner's lease, try, secret and deadline (a hash; see grant.lua)

	releasedBy string // the owner whose release last deleted the lock (see release.lua)

	boxed [6]any // lock, token, queue, waiters, waiting, releasedBy, each boxed once for the scripts' keys
}

func (l *Locker) keys(name string) *keys {
	return l.names.get(l.prefix, name)
}

// nameCache holds the keys of up to maxCachedNames lock names, so that a
// name locked again and again does not build its keys on every Acquire.
// When it is full it starts afresh: a Locker used with ever new names
// keeps a bounded set, and pays what every Acquire paid before.
type nameCache struct {
	mu sync.Mutex
	m  map[string]*keys
}

const maxCachedNames = 1024

func (c *nameCache) get(prefix, name string) *keys {
	c.mu.Lock()
	defer c.mu.Unlock()
	if k := c.m[name]; k != nil {
		return k
	}
	if c.m == nil || len(c.m) >= maxCachedNames {
		c.m = make(map[string]*keys)
	}
	base := prefix + ":{" + name + "}"
	// The scripts make the channel from the lock's key the same way
	// (lock .. ':released'): it is not sent with them.
	k := &keys{lock: base, token: base + ":token", channel: base + ":released", queue: base + ":queue", waiting: base + ":waiting"}
	k.waiters, k.releasedBy = base+":waiters", base+":released-by"
	k.boxed = [6]any{k.lock, k.token, k.queue, k.waiters, k.waiting, k.releasedBy}
	c.m[name] = k
	return k
}

// boxedMs keeps the last milliseconds value boxed in an interface, so that
// the script arguments of leases with the same TTL share one box.
type boxedMs struct{ last atomic.Pointer[msBox] }

type msBox struct {
	ms int64
	v  any
}

func (b *boxedMs) get(d time.Duration) any {
	ms := d.Milliseconds()
	if p := b.last.Load(); p != nil && p.ms == ms {
		return p.v
	}
	p := &msBox{ms, ms}
	b.last.Store(p)
	return p.v
}

// Acquire takes the lock called name; see fence.Locker.
//
// It tries once right away. If the lock is held and opts give a wait budget,
// that try queues it in Redis, and it subscribes to the lock's release
// channel: a release grants the lock to the first live waiter in the queue
// (FIFO across processes) and names it in its message, and that waiter
// holds the lease without another command (or confirms it with one; see
// the package doc, Waiting). It tries again when the holder's TTL runs out;
// it sends nothing else while it waits. A waiter that leaves without a
// lease withdraws from the queue, in the background, and gives back a
// grant that reached it.
//
// Within the wait budget, errors that pass by themselves are retried with
// jittered back-off (10 ms doubling to 1 s): the server unreachable or timing
// out (on a Ring, every shard marked down), LOADING, READONLY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, a Sentinel
// without a master yet, and too few replica acknowledgements
// (fence.ErrNotReplicated). Any other error (WRONGTYPE, auth or ACL,
// ErrBadTokenRecord) ends the wait at once. Either way the error is returned
// inside an error matching fence.ErrNotAcquired; when the budget ends on a
// transient error, that error rather than fence.ErrHeld. When it ends on a
// try not yet answered with a grant of the lock to this Acquire in hand
// (made by the holder's release, as above), the lock is given back, and
// the error, still matching fence.ErrHeld, says that the budget ran out
// confirming the grant (and, with replica sync, that the replicas had not
// acknowledged it yet).
//
// Acquire, like every call fence makes, returns by ctx's deadline even if
// the client does not honour it (go-redis without ContextTimeoutEnabled),
// with one exception: the release that undoes a take refused by replica
// sync is waited for 250 ms at least, so that a WAIT cut by ctx's deadline
// still leaves the lock free when the server answers (a release that hangs
// then goes on in the background, as WaitGiveBacks's do). An
// acquisition given up on may still run on the server when it answers late;
// when it did take the lock, the late reply releases it (owner-checked), so
// it blocks others for a round trip rather than for its lease time. If the
// reply never comes, the acquisition is revoked so that it refuses if it
// runs later (see the package doc, Deadlines). A try that took the lock
// with a reply past the lease's deadline gives it back the same way and
// gives no lease: Acquire tries again with a new owner within the wait
// budget (after a back-off, as after a transient error), or returns an error matching fence.ErrNotAcquired saying the reply
// came too late.
func (l *Locker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	if ctx == nil {
		return nil, nilctx.Err("redislock", "Acquire")
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
	if err := ctx.Err(); err != nil {
		return nil, fence.NotAcquired(name, err)
	}
	// A try that took the lock with a reply past the lease's deadline (a
	// paused or starved server) gave it back, revoking its owner: try
	// again, with a new owner, within what is left of the wait budget.
	end := time.Now().Add(o.Wait)
	var (
		bound time.Time // for the first try of a try again
		late  error     // the last late take's
		lates int       // late takes in a row
	)
	for {
		lease, err := l.acquireWithin(ctx, name, o, bound)
		if late != nil && err != nil && ctx.Err() == nil && !errors.Is(err, errLateReply) && !errors.Is(err, fence.ErrHeld) && !time.Now().Before(end) {
			// The budget ran out on the try again, cut short: say why
			// it was needed (not the caller's ctx, which has not ended).
			return nil, fmt.Errorf("%w; the wait budget ran out on the try again: %v", late, err)
		}
		if err == nil || !errors.Is(err, errLateReply) || o.Wait == 0 {
			return lease, err
		}
		if time.Until(end) < time.Millisecond || ctx.Err() != nil {
			return nil, err
		}
		// The try again is bounded by the budget, as every try but an
		// Acquire's first (its own first try would run on ctx alone, for
		// as long as the client's timeouts allow); and a server (or
		// network) too slow to answer within the lease time is not tried
		// again at once, as after a transient error.
		bound, late = end, err
		lates++
		if !pause.For(ctx, min(pause.Backoff(lates), time.Until(end))) {
			return nil, err
		}
		if o.Wait = time.Until(end); o.Wait < time.Millisecond {
			return nil, err
		}
	}
}

// acquireWithin is acquire with its options applied, for one owner: a try
// whose reply came too late ends it (errLateReply), its lock given back.
// A non-zero bound ends its first try, as the wait budget ends the others.
func (l *Locker) acquireWithin(ctx context.Context, name string, o fence.Options, bound time.Time) (fence.Lease, error) {
	start := time.Now()
	a := l.newAttempt(name, o.TTL)
	if o.Wait > 0 {
		// A try that finds the lock held queues this owner for as long
		// as this Acquire may wait; it is try number 1.
		a.acquireArgs[3], a.acquireArgs[4] = l.waitArg.get(o.Wait), 1
		l.expectJoin(a.owner)
		defer l.joined(a.owner)
	}
	firstCtx := ctx
	if !bound.IsZero() {
		var cancel context.CancelFunc
		firstCtx, cancel = context.WithDeadline(ctx, bound)
		defer cancel()
	}
	lease, holderTTL, err := l.try(firstCtx, a)
	switch {
	case lease != nil:
		return lease, nil
	case errors.Is(err, errLateReply):
		var budget time.Time
		if o.Wait > 0 {
			budget = start.Add(o.Wait)
		}
		l.giveBackLate(ctx, a, budget)
		return nil, fence.NotAcquired(name, err)
	case err != nil && (o.Wait == 0 || !waitThrough(err)):
		if a.kept {
			// The first try (sent without WAIT) took the lock, and its
			// confirmation, refused, kept it: given back before Acquire
			// returns, as the wait loop's withdrawal of a kept lock is
			// (fail), not only in the background
			// (TestKeptConfirmTakeGivenBackBeforeReturn).
			g := *a
			l.giveBackKept(ctx, start.Add(o.Wait), func() { l.releaseAbandoned(g) })
			return nil, fence.NotAcquired(name, closedClient(err))
		}
		l.giveUpMaybeHeld(a, err)
		return nil, fence.NotAcquired(name, closedClient(err))
	case o.Wait == 0:
		if a.resent {
			// The client may have sent the try twice: the first copy,
			// arriving once the lock is free, would take it for a lease
			// that nobody holds. Revoke the owner.
			l.goReleaseAbandoned(*a)
		}
		return nil, fence.NotAcquired(name, heldErr(a, holderTTL))
	}
	if l.mayRunLate(err) {
		a.resent = true // (see the end of the loop below)
	}

	waitCtx, cancel := context.WithDeadline(ctx, start.Add(o.Wait))
	defer cancel()
	var (
		me       *waiter         // nil until subscribed
		wake     <-chan struct{} // me's
		leave    func()
		tried    = start              // when the last try began
		sent     = []time.Time{start} // when each try began, by try number - 1
		failures int                  // transient errors in a row
		lastErr  error                // the last transient error, if the last try failed
		maybe    = err                // an error after which the script may have run
		confirm  error                // the report if the budget cuts the next try, which confirms a grant of a's (see grantConfirmation)
		heldTTL  = holderTTL          // the holder's TTL as the last try that read it found it (see heldErr)
	)
	defer func() {
		if leave != nil {
			leave()
		}
	}()
	fail := func(err error) (fence.Lease, error) {
		// Leave the queue, and give back a grant that came meanwhile.
		// After a try whose reply was lost or given up on, revoke the
		// owner too: that try may still run, and would queue it again
		// or take the lock (acquire.lua does neither for a revoked
		// owner).
		var revoke time.Duration
		if maybe != nil || a.resent { // (resent: see try)
			revoke = max(a.ttl, revokeFor)
		}
		g := *a
		if !a.kept {
			l.giveBacks.goRun(func() { l.withdraw(g, revoke) })
			return nil, fence.NotAcquired(name, closedClient(err))
		}
		// A lock kept after a refused try is given back before Acquire
		// returns, as undoRefused gives back a refused take: waited for
		// until ctx ends or the wait budget does, but for
		// lateGiveBackGrace at least, then left to the background
		// (giveBackKept).
		l.giveBackKept(ctx, start.Add(o.Wait), func() { l.withdraw(g, revoke) })
		return nil, fence.NotAcquired(name, closedClient(err))
	}
	// budgetOver says why waiting stopped: the caller's ctx; else the
	// budget ran out, while another owner held the lock or on the last
	// transient error.
	// A try cut while it confirmed a grant made to a says so (confirm):
	// the lock was a's, not held by another.
	budgetOver := func() (fence.Lease, error) {
		switch {
		case ctx.Err() != nil:
			return fail(ctx.Err())
		case confirm != nil:
			return fail(confirm)
		case lastErr != nil:
			return fail(lastErr)
		default:
			return fail(heldErr(a, heldTTL))
		}
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		var next time.Duration // before the next try; zero: try now
		confirm = nil
		switch {
		case err != nil:
			// A failover, a restart, a dropped connection: back off and
			// try again within the budget.
			failures++
			lastErr, next = err, pause.Backoff(failures)
		case wake == nil:
			// Held: subscribe to the release channel first.
			w, readyAt, lv, jerr := l.join(waitCtx, a.keys.channel, a.owner)
			switch {
			case jerr == nil:
				me, wake, leave = w, w.wake, lv
				if !l.sync.Disabled {
					// A grant gives what is left of the budget; one
					// shorter than the lease is confirmed anyway.
					l.coverable(me, start.Add(o.Wait-a.ttl))
				}
				failures, lastErr = 0, nil
				// A grant after the subscription was confirmed
				// reaches this Locker. If that was before the last try
				// began, the try saw everything before it and the
				// subscription will see everything after: wait.
				// Otherwise a grant may have fallen in between (the
				// next try finds the lock ours).
				if readyAt.Before(tried) {
					next = holderWait(holderTTL, o.Wait)
				}
			case waitCtx.Err() != nil:
				return budgetOver()
			case !transient(jerr):
				return fail(fmt.Errorf("redislock: subscribe: %w", jerr))
			default:
				failures++
				lastErr, next = fmt.Errorf("redislock: subscribe: %w", jerr), pause.Backoff(failures)
			}
		default:
			// Held: wait for a release or for the holder's TTL to run out.
			failures, lastErr = 0, nil
			next = holderWait(holderTTL, o.Wait)
		}
		if next > 0 {
			timer.Reset(next)
			if me != nil {
				l.setTimer(me, time.Now().Add(next), tried)
			}
		sleep:
			for {
				select {
				case <-wake:
					u := l.taken(me, a.synced)
					switch {
					case u.grant.owner != "":
						if ls := l.granted(ctx, a, u, sent); ls != nil {
							return ls, nil
						}
						// Not usable as it is: the try below confirms
						// it (finds the lock ours) or finds it is not.
						confirm = a.grantConfirmation(u, len(sent))
						break sleep
					case u.tryNow:
						break sleep
					case u.hold > 0:
						// A grant held back for a release of this
						// Locker in flight: confirm it by a try if
						// that release does not tell first.
						timer.Reset(u.hold)
					case !u.retime.IsZero():
						// Granted to another owner for less than this
						// timer: try when that grant ends.
						timer.Reset(time.Until(u.retime))
					}
				case <-timer.C:
					break sleep
				case <-waitCtx.Done():
					if me != nil {
						// A grant may have come with the budget's end
						// (select picks either): say so.
						confirm = a.grantConfirmation(l.taken(me, false), len(sent))
					}
					return budgetOver()
				}
			}
			timer.Stop()
			if me != nil {
				l.setTimer(me, time.Time{}, tried)
			}
		} else if me != nil {
			if u := l.taken(me, a.synced); u.grant.owner != "" {
				if ls := l.granted(ctx, a, u, sent); ls != nil {
					return ls, nil
				}
				confirm = a.grantConfirmation(u, len(sent))
			}
		}
		// Tries are bounded by the wait budget; one given up on that took
		// the lock gives it back when its late reply comes.
		tried = time.Now()
		sent = append(sent, tried)
		a.acquireArgs[3] = max(start.Add(o.Wait).Sub(tried).Milliseconds(), 1)
		a.acquireArgs[4] = len(sent)
		lease, holderTTL, err = l.try(waitCtx, a)
		if lease == nil && err == nil {
			heldTTL = holderTTL // a try cut by the budget reads none
		}
		switch {
		case lease != nil:
			return lease, nil
		case errors.Is(err, errLateReply):
			// Taken, too late to be used: give it back, revoked (the
			// caller tries again with a new owner, see acquire).
			l.giveBackLate(ctx, a, start.Add(o.Wait))
			return nil, fence.NotAcquired(name, err)
		case err != nil && (waitCtx.Err() != nil || errors.Is(err, context.DeadlineExceeded) && !time.Now().Before(start.Add(o.Wait))):
			// (A client that bounds its own calls can end one at the
			// deadline a moment before waitCtx's timer ends waitCtx.)
			// Ended by the deadline, inside the client or by bounded
			// (errGaveUp): the script may have run, or run later.
			maybe = err
			if confirm == nil && me != nil {
				// A grant that came while the try was out: the try,
				// whose reply was not read, ran before it or found the
				// lock a's by it.
				confirm = a.grantConfirmation(l.taken(me, false), len(sent)-1)
			}
			return budgetOver()
		case err != nil && !waitThrough(err):
			if errors.Is(err, errUnreleased) || errors.Is(err, errWaitFailed) {
				maybe = err
			}
			return fail(err)
		case err != nil:
			maybe = err
		}
		if l.mayRunLate(err) {
			// The next try, with the same owner, leaves this one behind:
			// arriving after the lease's release, it would take the lock
			// for nobody. The lease is released with a revocation.
			a.resent = true
		}
	}
}

// granted returns the lease that grant g gives a, or nil when g must be
// confirmed by a try (which finds the lock a's, with the same token, if
// the grant holds). The grant ran after a's try number g.try, so the lease
// counts from when that try was sent, on the local clock alone. A grant
// is confirmed when replica sync applies and no release of this Locker
// covered it with its WAIT (u.synced; see releaseLease: the releaser's
// connection wrote it, and a WAIT proves nothing until a's own connection
// writes), when it
// gives less than the lease time (the waiter's budget was nearly over), or
// when more than a quarter of the lease has passed since that try (a long
// wait, or a grant read late: see below).
//
// A grant is signed: the waiter's tries store a secret with its entry
// (never published), and the script publishes SHA-1(secret, grant), which
// the waiter checks. A client that may publish on the channel but not
// read fence's keys cannot make a waiter take a grant the script did not
// make (a forged one is confirmed by a try, which finds the truth); one
// that can read them could as well delete the lock. A replayed grant names
// an owner that no longer waits (owners are new for every Acquire), or
// followed an earlier try than a's last (it is confirmed by a try), or is
// the same truth again.
func (l *Locker) granted(ctx context.Context, a *attempt, u wakeup, sent []time.Time) *lease {
	g := u.grant
	// A covered grant is taken as it is only if a sent no try after the
	// one the grant followed: a later try (its timer, the hold-off's end)
	// confirmed the grant itself or, refused, gave the lock back, and the
	// release's WAIT, which may be told after that, covers a grant that
	// is no longer a's. Such a grant is confirmed as any other.
	//
	// Nor is any grant that followed an earlier try than a's last: that
	// try ran after the grant (the grant carries the number of the last
	// try that ran before it), and found the lock held by another, or
	// a would not be waiting (or its reply was lost: it may have found
	// the lock a's, and the next try finds it so again). Such a grant is
	// spent, and taking it as it is would let anyone who captured it off
	// the channel replay it: a waiter whose confirmation of it was
	// refused (too few replicas), and whose tries sync no longer applies
	// to (the replica gone, its count lowered), would take a lease on a
	// lock that another owner holds.
	covered := u.synced && g.try == len(sent)
	if a.synced && !covered || g.try != len(sent) || time.Duration(g.px)*time.Millisecond < a.ttl || !a.signedBy(g) {
		return nil
	}
	anchor := sent[g.try-1]
	if time.Since(anchor) > a.ttl/4 {
		// The lease maps its deadline to the server's clock from the
		// grant's server time read now, a lower bound that errs by as
		// long as the message took to be read, up to the time since the
		// anchor; a renewal run within that much of the deadline is
		// refused as late (extend.lua). Kept under a quarter of the
		// lease, the watchdog's first renewal, a third of the way in,
		// still lands in time.
		return nil
	}
	ls := l.newLease(ctx, a, fence.Token(g.token), anchor, time.Now(), g.server)
	if a.resent {
		ls.movedAhead() // an earlier try may still arrive (see try)
	}
	return ls
}

// grantConfirmation returns what Acquire reports when its wait budget ends
// on a try whose reply was not read, u.grant having come before it (the try
// confirms it: granted did not take it as it is) or while it was out: nil
// unless the grant is a's own (signed by a, and made after a's try number
// since at the earliest). It is reported, never taken. The error matches
// fence.ErrHeld, as any budget that ends under contention does (the lock
// was another's until the grant, and callers such as fence.Lead take
// ErrHeld for contention), and says that a grant was being confirmed, and,
// with replica sync and no release's WAIT covering the grant, that the
// replicas had not acknowledged it: not fence.ErrNotReplicated, which a
// short budget ending under plain contention with healthy replicas would
// then report too (TestContendedLockersInOneProcess, ci59).
func (a *attempt) grantConfirmation(u wakeup, since int) error {
	if u.grant.owner == "" || u.grant.try < since || !a.signedBy(u.grant) {
		return nil
	}
	if a.synced && !u.synced {
		return fmt.Errorf("%w (%w; its replicas had not acknowledged it)", fence.ErrHeld, errBudgetConfirming)
	}
	return fmt.Errorf("%w (%w)", fence.ErrHeld, errBudgetConfirming)
}

// signedBy reports whether g carries the MAC that the grant script makes
// with a's secret.
func (a *attempt) signedBy(g grantMsg) bool {
	if a.secret == "" {
		return false
	}
	sum := sha1.Sum([]byte(a.secret + " " + g.signed))
	return subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), []byte(g.mac)) == 1
}

// heldErr is the error of an Acquire that found a's lock held, the
// holder's key with ttl left: fence.ErrHeld, and for a key without expiry,
// which no Locker writes (every lock is set with PX), what that means: the
// key is another program's (a guard store given redislock's prefix writes
// its token records there, with no expiry), or was made persistent by
// hand, and only a DEL frees it. It was a plain ErrHeld for good.
func heldErr(a *attempt, ttl time.Duration) error {
	if ttl >= 0 {
		return fence.ErrHeld
	}
	return fmt.Errorf("%w (redislock: the lock's key %s has no expiry, which redislock never sets: another program writes that key (a guard store or a cache on the same prefix?), or it was made persistent by hand; only its deletion frees the lock)", fence.ErrHeld, a.keys.lock)
}

// holderWait is how long to wait for a holder whose lock has ttl left
// (negative: no expiry, so only a release frees it).
func holderWait(ttl, budget time.Duration) time.Duration {
	if ttl < 0 {
		return budget
	}
	return max(ttl, time.Millisecond)
}

// giveBackLate gives back the lock that a's try took with a reply past the
// lease's deadline, as an acquisition given up on (owner-checked, its owner
// revoked, out of the queue), and waits for that until ctx ends or the wait
// budget does (at budget; zero: none), but for at least lateGiveBackGrace,
// the give-back going on without it, bounded by the lease time or a
// second: a caller that tries again at once, as a new owner, or exits,
// then finds (leaves) the lock free rather than held by nobody.
func (l *Locker) giveBackLate(ctx context.Context, a *attempt, budget time.Time) {
	done := make(chan struct{})
	g := *a
	l.giveBacks.goRun(func() {
		defer close(done)
		l.releaseAbandoned(g)
	})
	var over <-chan time.Time
	if !budget.IsZero() {
		t := time.NewTimer(max(time.Until(budget), lateGiveBackGrace))
		defer t.Stop()
		over = t.C
	}
	select {
	case <-done:
	case <-ctx.Done():
	case <-over:
	}
}

// giveBackKept runs giveBack, the give-back of a kept lock, counted for
// WaitGiveBacks, and waits for it until ctx ends or the wait budget does
// (at budget), but for lateGiveBackGrace at least; then it goes on in the
// background. A ctx without a deadline does not end: waited for until
// then, a hung server held the Acquire for the give-back's own bound, the
// lease time (TestKeptGrantWithdrawalHungWithinBudget).
func (l *Locker) giveBackKept(ctx context.Context, budget time.Time, giveBack func()) {
	done := make(chan struct{})
	l.giveBacks.goRun(func() { defer close(done); giveBack() })
	grace := time.NewTimer(lateGiveBackGrace)
	defer grace.Stop()
	select {
	case <-done:
		return
	case <-grace.C:
	}
	over := time.NewTimer(time.Until(budget))
	defer over.Stop()
	select {
	case <-done:
	case <-ctx.Done():
	case <-over.C:
	}
}

// lateGiveBackGrace is how long giveBackLate waits for the give-back at
// least, whatever is left of the wait budget: an Acquire's first try runs
// on ctx alone, so with a budget no longer than the lease time a late
// reply comes past the budget, and a server that answers again takes a
// round trip (a slow one, a few) to free the lock; one that hangs holds
// the Acquire no longer than this past its budget.
const lateGiveBackGrace = 250 * time.Millisecond

// giveUpMaybeHeld releases, in the background, a lock that a try whose
// reply was lost (err) may have taken after all. A try with the same owner
// would have found it; the caller will not make one.
func (l *Locker) giveUpMaybeHeld(a *attempt, err error) {
	if errors.Is(err, errUnreleased) || errors.Is(err, errWaitFailed) {
		// Refused by replica sync, and the release that should have
		// undone the acquisition failed (or was given up on), or the
		// script ran and its WAIT failed: the lock is held, by nobody,
		// for its lease time.
		l.goReleaseAbandoned(*a)
		return
	}
	if errors.Is(err, errGaveUp) {
		// The try's abandoned callback releases or revokes it, but only
		// once the client has given up on the call (its read timeout,
		// 3 s by default), by when a program that cancelled its Acquire
		// on the way out (^C) has exited and the lock stays held for its
		// lease time. Give it back, revoked, now as well: a copy of the
		// try that runs later is refused.
		l.goReleaseAbandoned(*a)
		return
	}
	if a.resent {
		l.goReleaseAbandoned(*a) // the client may have sent it twice (see try)
		return
	}
	// A deadline or a cancellation that ended the call may have ended it
	// after the script was sent (a client with ContextTimeoutEnabled
	// reads on until the deadline, then says context.Canceled); it is
	// not worth retrying (transient), but it may have run.
	switch {
	case !l.mayRunLate(err):
	case errors.Is(err, syscall.ECONNREFUSED):
		l.parking.park(l, abandoned(*a)) // sent once the server answers
	default:
		l.goReleaseAbandoned(*a)
	}
}

// attempt is one Acquire call's fixed parameters, and the script arguments
// made from them once, for every try and the lease's release.
type attempt struct {
	name      string
	keys      *keys
	owner     string // a substring of revokeKey
	revokeKey string // the mark that revokes this owner, in the lock's slot
	secret    string // signs grants to this owner (see granted)
	ttl       time.Duration
	watchdog  bool

	ownerArg     any       // owner followed by secret (and S: SPUBLISH; B: both, see publishMode), boxed: the scripts' ARGV[1]
	acquireKeys  [5]string // lock, token, revokeKey, queue, waiters
	acquireBoxed [5]any
	releaseKeys  [7]string // lock, token, queue, waiters, waiting, revokeKey, releasedBy
	releaseBoxed [7]any
	acquireArgs  [5]any // owner, lease ms, token record retention ms, wait ms, try number (see acquire.lua)
	releaseArgs  [4]any // owner, token record retention ms, -1 (no withdrawal), 1 (a lease's release: see release.lua)
	synced       bool   // the last try that found the lock held had replica sync apply
	// resent: a try took so long that the client may have sent it again
	// (Locker.resendAfter), or one whose reply was lost was followed by
	// another (mayRunLate), and the first may still run: the lease is
	// released with a revocation, so that it refuses then.
	resent bool
	// kept: a try refused by replica sync kept the lock, found its own
	// already (see tryOr); the Acquire's withdrawal gives it back.
	kept bool

	// home is the lease that the first successful try fills in: the
	// attempt lives in it from the start, so that an acquisition
	// allocates one object for both. Nil once used.
	home *lease
}

// newAttempt returns an attempt on name with a new owner, for a lease of
// ttl (zero: the watchdog's).
func (l *Locker) newAttempt(name string, ttl time.Duration) *attempt {
	k := l.keys(name)
	revokeKey, secret := revocationKey(k.lock, l.publishMode())
	owner := revokeKey[len(revokeKey)-ownerLen:]
	ls := new(lease)
	a := &ls.attempt
	*a = attempt{name: name, keys: k, owner: owner, revokeKey: revokeKey, secret: secret[ownerLen : ownerLen+secretLen], ttl: ttl, home: ls,
		ownerArg:    secret,
		acquireKeys: [5]string{k.lock, k.token, revokeKey, k.queue, k.waiters},
		releaseKeys: [7]string{k.lock, k.token, k.queue, k.waiters, k.waiting, revokeKey, k.releasedBy}}
	var revokeArg any = revokeKey
	a.acquireBoxed = [5]any{k.boxed[0], k.boxed[1], revokeArg, k.boxed[2], k.boxed[3]}
	a.releaseBoxed = [7]any{k.boxed[0], k.boxed[1], k.boxed[2], k.boxed[3], k.boxed[4], revokeArg, k.boxed[5]}
	if ttl == 0 {
		a.ttl, a.watchdog = l.watchdog, true
	}
	retention := l.retainArg.get(l.retention)
	if a.ttl > l.retention {
		retention = a.ttl.Milliseconds()
	}
	a.acquireArgs = [5]any{a.ownerArg, l.ttlArg.get(a.ttl), retention, 0, 0}
	a.releaseArgs = [4]any{a.ownerArg, retention, -1, 1}
	return a
}

// try runs the acquire script once. It returns the lease when the lock was
// taken, or the holder's remaining TTL (negative: no expiry) when it is held.
//
// With replica sync, a waiting Acquire's first try on a lock that other
// Acquires of this Locker are waiting for (it is held, or being handed from
// one to the next) is sent without WAIT (later tries, which follow a grant,
// a release or a holder's TTL, are synced as before): it will almost surely queue, and a WAIT
// after a try that queued proves nothing anyone uses (the grant that
// follows is confirmed with a synced try of its own, see granted), while it
// costs the primary and the replica an acknowledgement each. When such a
// try takes the lock after all, the lock is not used until a synced try
// (the same owner: it finds the lock its own and keeps the token) has
// covered the take with its WAIT: WAIT counts every earlier write of the
// primary's replication stream, and the take came before the confirming
// try's own write. A confirmation refused or failed leaves the lock to the
// same handling as any synced try's (given back, owner-checked).
func (l *Locker) try(ctx context.Context, a *attempt) (*lease, time.Duration, error) {
	noWait := !l.sync.Disabled && a.acquireArgs[3] != 0 && a.acquireArgs[4] == 1 && l.othersWait(a.keys.channel, a.owner)
	var began time.Time
	if l.resendAfter > 0 {
		began = time.Now()
	}
	ls, ttl, unsynced, err := l.tryOr(ctx, a, noWait)
	if unsynced {
		ls, ttl, err = l.confirmTake(ctx, a)
	}
	if l.sentTwice(began) {
		a.resent = true
	}
	if a.resent && ls != nil {
		ls.attempt.resent = true // not the caller's yet
		// The first copy, arriving during the lease, finds the lock its
		// own and moves its expiry past the deadline: give the lock back
		// (revoked) if the lease ends unreleased.
		ls.movedAhead()
	}
	return ls, ttl, err
}

// waitThrough reports whether a waiting Acquire tries again, with the same
// owner, after a try that failed with err: a transient error, unless the
// try took the lock and its undo (replica sync refused it) failed. That
// undo, an owner-checked release that may still be on its way, would
// delete the lock under a lease that a later try of the same owner got;
// the Acquire gives up instead, and its withdrawal revokes the owner.
func waitThrough(err error) bool {
	return transient(err) && !errors.Is(err, errUnreleased)
}

// mayRunLate reports whether a try that failed with err may have reached
// the server, or may yet: it was written, or sent again by the client,
// before its reply was lost or given up on. A try made after it with the
// same owner leaves it behind, to arrive at any time.
func (l *Locker) mayRunLate(err error) bool {
	switch {
	case errors.Is(err, errNotSent) || errors.Is(err, fence.ErrNotReplicated):
		return false // never sent, or ran and was undone (replica sync)
	case errors.Is(err, syscall.ECONNREFUSED):
		// A refused connection sends nothing, but it may end a client's
		// own resends of a copy that ran, its reply lost with the
		// connection as the server went down
		// (TestRefusedRetryAfterLostReplyGivesBack): a server that kept
		// its data has the lock when it is back. Only a client that
		// resends: the give-back is parked until the server answers (see
		// parking), one more entry per failed Acquire while it is down.
		return l.resends
	}
	return transient(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// syncWithin sets the replica sync timeout when none is given, and refuses
// one the client cannot wait for. WAIT's reply comes on the connection the
// client reads with its ReadTimeout, up to one server clock tick (waitTick)
// after WAIT's timeout: a WAIT that waits as long as the read times the
// read out, and the caller gets the client's i/o timeout (and a connection
// closed) where a replica that lags should give fence.ErrNotReplicated.
// The default is 1 s, or less when the read timeout is short: half of what
// the tick leaves of it.
func (l *Locker) syncWithin(client redis.UniversalClient) error {
	var rt time.Duration
	if client != nil && !l.sync.Disabled {
		rt, _ = resend.ReadTimeout(client)
	}
	if l.sync.Timeout == 0 {
		l.sync.Timeout = time.Second
		if rt > 0 {
			l.sync.Timeout = min(l.sync.Timeout, max((rt-waitTick)/2, time.Millisecond))
		}
		if rt > 0 && l.sync.Timeout+waitTick >= rt {
			// No timeout fits: a read timeout of 100 ms or less, within
			// which WAIT's reply, even for 1 ms, may not come
			// (TestSyncShortTimeoutRefusal: the client's i/o timeout).
			// Refused at the first try that needs a WAIT, not here: on a
			// primary without replicas none is sent, and such a client
			// works (TestShortReadTimeoutNoReplicas).
			l.syncUnfit = fmt.Errorf("%w: redislock: the client's read timeout %v leaves no room for replica sync's WAIT, which Redis may answer up to %v late: raise ReadTimeout above %v, or disable replica sync",
				fence.ErrInvalidOption, rt, waitTick, waitTick+time.Millisecond)
		}
		return nil
	}
	if rt > 0 && l.sync.Timeout+waitTick >= rt {
		return fmt.Errorf("%w: redislock: replica sync timeout %v and WAIT's clock tick (up to %v) do not fit in the client's read timeout %v, within which WAIT's reply must come",
			fence.ErrInvalidOption, l.sync.Timeout, waitTick, rt)
	}
	return nil
}

// ReplicaSyncRefusal returns the error, matching fence.ErrInvalidOption,
// that every acquisition and renewal needing a WAIT gets because the
// client's read timeout (100 ms or less) leaves no room for one; nil when
// it does, or when replica sync is off. On a primary without replicas no
// WAIT is sent, and such a Locker works.
//
// On a client whose type redislock cannot identify (see
// HiddenClusterError) it is also the *HiddenClusterError that every
// acquisition gets once the first synced call has found the server to be
// a Redis Cluster node; nil until that call is made. Likewise, on a
// *redis.ClusterClient whose servers are not in cluster mode (one of
// redis.NewFailoverClusterClient), the error matching
// fence.ErrInvalidOption that every acquisition gets once one has found it.
func (l *Locker) ReplicaSyncRefusal() error {
	if err := l.made(); err != nil {
		return err
	}
	if l.syncUnfit != nil {
		return l.syncUnfit
	}
	if e := l.probe.refusal.Load(); e != nil && !l.sync.Disabled {
		return e
	}
	if e := l.notCluster.Load(); e != nil && !l.sync.Disabled {
		return *e
	}
	return nil
}

// waitTick is how late Redis may answer a WAIT that timed out: it times
// WAIT out on its clock tick, 10 a second by default (hz).
const waitTick = 100 * time.Millisecond

// confirmTake confirms with a synced try a lock that a try without WAIT
// took (see try). A transient error leaves it to the waiting Acquire,
// whose next try finds the lock its own, or whose withdrawal (it gives up)
// deletes it; so does a confirmation given up on (its abandoned callback).
// Any other error says the lock was not released: the caller gives it back
// (giveUpMaybeHeld, or the withdrawal after errUnreleased).
func (l *Locker) confirmTake(ctx context.Context, a *attempt) (*lease, time.Duration, error) {
	ls, ttl, _, err := l.tryOr(ctx, a, false)
	if err != nil && !transient(err) && !errors.Is(err, errGaveUp) && !errors.Is(err, errUnreleased) {
		err = errors.Join(err, errUnconfirmed)
	}
	return ls, ttl, err
}

// errUnconfirmed is in the error of a confirmation that failed after a try
// without WAIT took the lock: the lock is still there (see confirmTake).
var errUnconfirmed = fmt.Errorf("%w: taken without WAIT, not confirmed", errUnreleased)

// othersWait reports whether other Acquires of this Locker than owner wait
// on channel's lock.
func (l *Locker) othersWait(channel, owner string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.subscriptions[channel]
	if w == nil {
		return false
	}
	for _, c := range w.waiters {
		if c.owner != owner {
			return true
		}
	}
	return false
}

// tryOr is try, with noWait sending the script without WAIT; unsynced then
// reports that it took the lock, which the caller must confirm.
func (l *Locker) tryOr(ctx context.Context, a *attempt, noWait bool) (_ *lease, _ time.Duration, unsynced bool, _ error) {
	sent := time.Now()
	var abandoned func(synced, error)
	if !l.calls.direct(ctx) {
		given := *a
		abandoned = func(r synced, err error) {
			// Given up on. If it ran after all, the lock is ours and
			// nobody will use it: give it back rather than block others
			// for its TTL. If its reply was lost too (the client's own
			// timeout), it may still run: revoke it.
			// A waiting try that found the lock held queued the
			// owner, which nobody will use either: withdraw it.
			if err != nil || r.reply == nil {
				l.releaseAbandoned(given)
				return
			}
			res, _ := r.reply.Int64Slice()
			if len(res) > 0 && res[0] == 1 || given.acquireArgs[3] != 0 {
				l.releaseAbandoned(given)
			}
		}
	}
	r, err := l.evalBoundedOr(ctx, noWait, abandoned, acquireScript, skeys{a.acquireKeys[:], a.acquireBoxed[:]}, a.acquireArgs[:]...)
	replied := time.Now()
	acked, required := r.acked, r.required
	// The script's reply was read, WAIT's did not come in time: judged by
	// the reply below, a take refused as not replicated.
	unanswered, waitErr := unansweredWait(err), err
	if unanswered != nil && required > 0 && r.reply != nil && r.reply.Err() == nil {
		err, acked = nil, 0
	} else {
		unanswered = nil
	}
	var res []int64
	var buf [4]int64
	if err == nil {
		res, err = int64s(r.reply, buf[:0])
	}
	if err == nil && !acquireReply(res) {
		err = fmt.Errorf("unexpected reply %v", slices.Clone(res))
	}
	if err != nil {
		if err = scriptError(err); !errors.Is(err, ErrBadTokenRecord) && !strings.HasPrefix(err.Error(), "redislock: ") {
			err = fmt.Errorf("redislock: %w", err)
		}
		return nil, 0, false, err
	}
	if res[0] == 0 {
		if unanswered != nil {
			// Queued, or not: as after any failed WAIT (giveUpMaybeHeld).
			return nil, 0, false, waitErr
		}
		a.synced = required > 0
		return nil, time.Duration(res[1]) * time.Millisecond, false, nil
	}
	if noWait && required > 0 {
		return nil, 0, true, nil // taken unsynced: the caller confirms
	}
	if acked < required {
		// Too few replicas have the lock: a failover now could lose it.
		// Give it back, even if ctx has ended, and refuse (see
		// undoRefused).
		var notRepl error = &fence.NotReplicatedError{Acked: acked, Required: required}
		if unanswered != nil {
			// WAIT's reply did not come in time (the client's read
			// timeout, or ctx's end): nothing confirmed the take.
			notRepl = notAnswered(notRepl, unanswered, waitErr)
		}
		l.syncRefused(ctx, a.name, 0, false, acked, required)
		if len(res) == 4 && a.acquireArgs[3] != 0 && unanswered == nil {
			// The lock was this waiter's before the try (granted to
			// it): it keeps its place in line. It keeps the lock,
			// which nobody uses (no lease is returned), and its next
			// try, after a back-off, finds it its own and confirms it
			// again; its withdrawal gives the lock back if its budget
			// ends first (as after confirmTake's transient errors).
			// Given back now, the lock went to the next waiter, and
			// this one queued behind it (TestRefusedGrantKeepsPlace).
			// The try set the lock's expiry to the lease time: it is
			// brought down to what is left of the budget, as the grant
			// had it, or a waiter that died keeping it held it for its
			// lease time (TestKeptRefusedGrantExpiryWithinBudget). A
			// failure leaves that undone, and it may yet run, after a
			// later try confirmed the lock: the Acquire gives up, as
			// after a failed undo.
			a.kept = true
			if err := l.keepWithin(ctx, a); err != nil {
				return nil, 0, false, errors.Join(notRepl, fmt.Errorf("%w: %w", errUnreleased, err))
			}
			return nil, 0, false, notRepl
		}
		if err := l.undoRefused(ctx, a); err != nil {
			return nil, 0, false, errors.Join(notRepl, fmt.Errorf("%w: %w", errUnreleased, err))
		}
		return nil, 0, false, notRepl
	}
	if !replied.Before(deadline(sent, a.ttl)) {
		// Taken (or a grant confirmed) with a reply that came after the
		// lease's deadline: the lease would be over before anyone used
		// it. The caller gives the lock back as after a try given up
		// on, revoked (giveUpMaybeHeld, or the waiting Acquire's
		// withdrawal), and tries again with a new owner if its budget
		// allows.
		return nil, 0, false, lateReply(sent, replied, a.ttl)
	}
	return l.newLease(ctx, a, fence.Token(res[1]), sent, replied, res[2]), 0, false, nil
}

// keepWithin brings the expiry of the lock that a keeps, its try refused by
// replica sync, down to the wait budget that was left when the try was sent
// (keep.lua), owner-checked. A call that took so long that the client may
// have sent it twice (Locker.resendAfter) fails: its first copy may still
// run, after a later try confirmed the lock for a lease, and cut the lock's
// expiry below the lease's deadline (TestKeptRefusedGrantResentCapLate).
func (l *Locker) keepWithin(ctx context.Context, a *attempt) error {
	wait, _ := a.acquireArgs[3].(int64)
	keys, args := skeys{a.acquireKeys[:1], a.acquireBoxed[:1]}, []any{a.ownerArg, max(wait, 1)}
	call := func(ctx context.Context) (struct{}, error) {
		_, _, _, err := l.evalRouted(ctx, keepScript, keys, args...)
		return struct{}{}, err
	}
	began := time.Now()
	var err error
	if l.calls.direct(ctx) {
		_, err = call(ctx)
		err = l.calls.directErr(ctx, err)
	} else {
		_, err = bounded(ctx, &l.calls, call, nil)
	}
	if err == nil && l.sentTwice(began) {
		err = fmt.Errorf("redislock: the kept lock's expiry took %v to bring down, and the client may have sent it twice", time.Since(began).Round(time.Millisecond))
	}
	return err
}

// sentTwice reports whether a call begun at began has taken so long that
// the client may have sent it twice (resendAfter; never when zero): its
// first copy may still run.
func (l *Locker) sentTwice(began time.Time) bool {
	return l.resendAfter > 0 && time.Since(began) >= l.resendAfter
}

// acquireReply reports whether res is a reply that acquire.lua gives: {0,
// PTTL} (held), {1, token, server ms} (taken), {1, token, server ms, 1}
// (the caller's already). Anything else (a proxy's, a hook's, another
// script's) is refused as unexpected: {2, x} passed the check before, as
// a take, and indexed past its end (a panic).
func acquireReply(res []int64) bool {
	switch len(res) {
	case 2:
		return res[0] == 0
	case 3:
		return res[0] == 1 && res[1] > 0
	case 4:
		return res[0] == 1 && res[1] > 0 && res[3] == 1
	}
	return false
}

// undoRefused gives back, owner-checked, the lock that a's try took but
// replica sync refused, even if ctx has ended: within the sync timeout, or
// a second when that is shorter (a sync timeout of 1 ms, given, or the
// default on a client whose ReadTimeout is 102 ms, left the release no
// time for its round trip: TestSyncShortTimeoutRefusal). It waits for that
// until ctx ends, but for at least lateGiveBackGrace (a WAIT that ran into
// ctx's deadline leaves none: the lock is still given back before Acquire
// returns when the server answers), and then returns ctx's error, the
// release going on in the background, counted for WaitGiveBacks: one that
// hangs held the Acquire up to a second past its wait budget and ctx's
// deadline (TestRefusedTakeUndoHungWithinDeadline). The caller treats an
// error as a release that may not have happened (errUnreleased).
func (l *Locker) undoRefused(ctx context.Context, a *attempt) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(l.sync.Timeout, time.Second))
	done := make(chan error, 1)
	g := *a
	l.giveBacks.goRun(func() {
		defer cancel()
		began := time.Now()
		_, err := l.releaseOwned(rctx, &g, -1, false)
		if err == nil && l.sentTwice(began) {
			// The client may have sent it twice, and the first copy
			// may still run: after a later try of this owner took the
			// lock, it would delete it under that lease
			// (TestRefusedTakeUndoResentLate). Failed, the Acquire
			// gives up (errUnreleased), as keepWithin's caller does.
			err = fmt.Errorf("redislock: the undo took %v, and the client may have sent it twice", time.Since(began).Round(time.Millisecond))
		}
		done <- err
	})
	grace := time.NewTimer(lateGiveBackGrace)
	defer grace.Stop()
	select {
	case err := <-done:
		return err
	case <-grace.C:
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("redislock: not waited for past the caller's context: %w", ctx.Err())
	}
}

// releaseOwned runs the owner-checked release script and reports whether it
// deleted the lock (and granted it to the next waiter). With revoke >= 0 it
// also withdraws the owner from the queue of waiters, and with revoke > 0
// leaves a mark for that long, whether or not it deleted the lock, that
// makes any later run of this owner's acquire script refuse (see
// release.lua). revoke < 0: a plain release. lease: the release of a
// lease (its Release), which records its owner when it deletes the lock, so
// that the same script sent again by the client answers as the first run
// did; a give-back neither records nor reads that record (its result goes
// unread, and its owner may take the lock again: see undoRefused).
func (l *Locker) releaseOwned(ctx context.Context, a *attempt, revoke time.Duration, lease bool) (bool, error) {
	keys, args := skeys{a.releaseKeys[:], a.releaseBoxed[:]}, a.releaseArgs[:2]
	switch {
	case revoke >= 0 && lease:
		args = []any{a.releaseArgs[0], a.releaseArgs[1], revoke.Milliseconds(), 1}
	case revoke >= 0:
		args = []any{a.releaseArgs[0], a.releaseArgs[1], revoke.Milliseconds()}
	case lease:
		args = a.releaseArgs[:]
	}
	if l.calls.direct(ctx) {
		// No closure for bounded, which would call straight through.
		deleted, err := l.release(ctx, keys, args...)
		return deleted, l.calls.directErr(ctx, err)
	}
	return bounded(ctx, &l.calls, func(ctx context.Context) (bool, error) {
		return l.release(ctx, keys, args...)
	}, nil)
}

// releaseLease is releaseOwned for a lease's Release. With replica sync,
// when Acquires of this Locker wait for the lock, the release is sent with
// WAIT in the same round trip: its grant to one of them, written on the
// release's connection, is then covered by that WAIT, and the waiter takes
// it without a confirming try of its own (see granted). The WAIT's outcome
// does not change the release's: a grant it did not cover is confirmed by
// its waiter, as any other.
func (l *Locker) releaseLease(ctx context.Context, a *attempt) (bool, error) {
	if a.resent {
		// A try of this lease's may have been sent twice: revoke the
		// owner as the lock is released, or the first, arriving late,
		// would take the lock for a lease that nobody holds.
		return l.releaseOwned(ctx, a, max(a.ttl, revokeFor), true)
	}
	if dl, ok := ctx.Deadline(); l.sync.Disabled || ok && time.Until(dl) < 2*l.sync.Timeout {
		// (A WAIT that could outlast the caller's deadline would turn a
		// release that happened into one reported failed. A cancellation
		// during the WAIT does so too, as one during any call's round
		// trip does: the lease then gives the lock back owner-checked,
		// which finds it granted on and leaves it.)
		return l.releaseOwned(ctx, a, -1, true)
	}
	w := l.handing(a.keys.channel)
	if w == nil {
		return l.releaseOwned(ctx, a, -1, true)
	}
	// handed once: by the call, or when Release returns without its
	// answer (given up on, or never sent); a waiter holding its grant back
	// then confirms it.
	var once sync.Once
	handed := func(r released, synced bool) { once.Do(func() { l.handed(w, r, synced) }) }
	defer handed(released{}, false)
	keys, args := skeys{a.releaseKeys[:], a.releaseBoxed[:]}, a.releaseArgs[:]
	call := func(ctx context.Context) (bool, error) {
		var r released
		reply, acked, required, err := l.evalSyncedOr(ctx, false, releaseScript, keys, args...)
		if reply != nil && reply.Err() == nil && (err == nil || errors.Is(err, errWaitFailed)) {
			r, err = parseReleased(reply.Val())
		}
		handed(r, err == nil && acked >= required)
		return r.deleted, err
	}
	if l.calls.direct(ctx) {
		deleted, err := call(ctx)
		return deleted, l.calls.directErr(ctx, err)
	}
	return bounded(ctx, &l.calls, call, nil)
}

// release runs the release script and reports whether it deleted the lock.
func (l *Locker) release(ctx context.Context, keys skeys, args ...any) (bool, error) {
	reply, _, _, err := l.evalRouted(ctx, releaseScript, keys, args...)
	if err != nil {
		return false, err
	}
	r, err := parseReleased(reply.Val())
	return r.deleted, err
}

// released is the release script's reply: whether it deleted the lock,
// and the owner it granted the lock to with its token, if it did.
type released struct {
	deleted bool
	owner   string
	token   int64
}

// parseReleased reads the release script's reply: 0, 1 or {1, owner, token}.
func parseReleased(v any) (released, error) {
	switch v := v.(type) {
	case int64:
		if v == 0 || v == 1 {
			return released{deleted: v == 1}, nil
		}
	case []any:
		if len(v) == 3 {
			n, _ := v[0].(int64)
			owner, _ := v[1].(string)
			token, _ := v[2].(int64)
			if n == 1 && len(owner) == ownerLen && token > 0 {
				return released{true, owner, token}, nil
			}
		}
	}
	return released{}, fmt.Errorf("redislock: unexpected release reply %v", v)
}

// errUnreleased is in the error of a try refused by replica sync whose
// release failed: the lock it took is still there (giveUpMaybeHeld).
var errUnreleased = errors.New("redislock: release after failed sync")

// errWaitFailed is in the error of a call whose script ran but whose WAIT
// failed (an ACL that denies WAIT, say): a try's script may have taken the
// lock, and nobody holds it (giveUpMaybeHeld).
var errWaitFailed = errors.New("redislock: replica WAIT failed")

// waitUnanswered is the error of a call whose script's reply was read but
// whose WAIT's was not, in time: the read timed out (the client's
// ReadTimeout, which a server with a low hz can outrun: it answers a WAIT
// that timed out up to a clock tick late) or the caller's ctx ended. It
// matches errWaitFailed too. The script's reply is returned with it: a try
// or a renewal that it says took or moved the lock is refused as not
// replicated, wrapping err (nothing confirmed it within the budget), and
// the lock is given back as after a WAIT that acknowledged too few.
type waitUnanswered struct{ err error }

func (e *waitUnanswered) Error() string {
	return "redislock: replica WAIT's reply did not come in time: " + e.err.Error()
}

func (e *waitUnanswered) Unwrap() []error { return []error{errWaitFailed, e.err} }

// waitError is the error of a call whose script ran and whose WAIT failed
// with err: a *waitUnanswered when WAIT's reply did not come in time (a
// socket timeout, or ctx's end), else one matching errWaitFailed.
func waitError(err error) error {
	if isNetTimeout(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return &waitUnanswered{err}
	}
	return fmt.Errorf("%w: %w", errWaitFailed, err)
}

// notAnswered is notRepl, a refusal as not replicated because WAIT's reply
// did not come in time, wrapping cause (unansweredWait's) and the caller's
// context's end when waitErr, the call's error, names it (see directErr),
// but not errWaitFailed: the refusal has dealt with the lock.
func notAnswered(notRepl, cause, waitErr error) error {
	err := fmt.Errorf("%w: redislock: WAIT's reply did not come in time: %w", notRepl, cause)
	for _, cerr := range [2]error{context.DeadlineExceeded, context.Canceled} {
		if errors.Is(waitErr, cerr) && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w: %w", err, cerr)
		}
	}
	return err
}

// unansweredWait returns the cause when err says that a script's reply was
// read and its WAIT's did not come in time (see waitUnanswered), else nil.
func unansweredWait(err error) error {
	if err == nil {
		return nil // before wu, which errors.As would move to the heap on every call
	}
	var wu *waitUnanswered
	if errors.As(err, &wu) {
		return wu.err
	}
	return nil
}

// ownerLen is the length of an owner id: 128 random bits, hex-encoded;
// secretLen that of the secret that signs its grants: 64 random bits.
const (
	ownerLen  = 32
	secretLen = 16
)

// publishMode is how this Locker's scripts publish grants (see
// revocationKey): 'S' with SPUBLISH on a cluster client, 'B' with both
// PUBLISH and SPUBLISH on a client of a type New cannot identify (it may
// hide a cluster client, whose other Lockers subscribe with SSUBSCRIBE,
// or a single server's, whose others subscribe with SUBSCRIBE: see
// subscribe) and on a cluster client given its slots (bothWays), 0 with
// PUBLISH.
func (l *Locker) publishMode() byte {
	switch {
	case l.opaque || l.bothWays:
		return 'B'
	case l.sharded:
		return 'S'
	}
	return 0
}

// revocationKey returns lock's revocation mark for a new owner id, which
// ends it: lock + ":revoked:" + owner, and the owner followed by a new
// secret, built in one allocation so that both are substrings of it. With
// mode not 0, ownerSecret ends with it: the scripts then publish grants
// with SPUBLISH ('S') or with both PUBLISH and SPUBLISH ('B') rather than
// PUBLISH (one argument fewer on every call).
func revocationKey(lock string, mode byte) (key, ownerSecret string) {
	var b [(ownerLen + secretLen) / 2]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	var h [ownerLen + secretLen]byte
	hex.Encode(h[:], b[:])
	var sb strings.Builder
	sb.Grow(len(lock) + len(":revoked:") + len(h) + 1)
	sb.WriteString(lock)
	sb.WriteString(":revoked:")
	sb.Write(h[:])
	if mode != 0 {
		sb.WriteByte(mode)
	}
	s := sb.String()
	end := len(lock) + len(":revoked:") + len(h)
	return s[:end-secretLen], s[end-secretLen-ownerLen:]
}

// made refuses a Locker that New did not make (a zero Locker, or a nil
// one): it has no client, and its first call panicked in a background
// goroutine, which no recover of the caller's can catch, so the whole
// program died.
func (l *Locker) made() error {
	if l == nil || (l.client == nil && l.conn == nil) {
		return fmt.Errorf("%w: redislock: a Locker not made by New (zero or nil): use redislock.New", fence.ErrInvalidOption)
	}
	return nil
}

// check refuses a ReplicaSync out of range, naming the field and what it
// takes (the whole struct, printed, left the user to guess which).
func (s ReplicaSync) check() error {
	switch {
	case s.Acks < AcksAll:
		return fmt.Errorf("%w: redislock: ReplicaSync.Acks %d: want a number of replicas (1 or more; 0 means 1), AcksMajority (%d) or AcksAll (%d)", fence.ErrInvalidOption, s.Acks, AcksMajority, AcksAll)
	case s.Replicas < 0:
		return fmt.Errorf("%w: redislock: ReplicaSync.Replicas %d: want 0 (read from the primary) or more", fence.ErrInvalidOption, s.Replicas)
	case s.Timeout < 0 || s.Timeout > 0 && s.Timeout < time.Millisecond:
		return fmt.Errorf("%w: redislock: ReplicaSync.Timeout %v: want 0 (the default) or at least 1ms", fence.ErrInvalidOption, s.Timeout)
	case !s.Disabled && s.Replicas > 0 && s.Acks > s.Replicas:
		// Never met: every acquisition would wait for WAIT's timeout and
		// fail with ErrNotReplicated, which reads as "try again later".
		return fmt.Errorf("%w: redislock: ReplicaSync.Acks %d is more than the %d ReplicaSync.Replicas expected: no acquisition could be confirmed", fence.ErrInvalidOption, s.Acks, s.Replicas)
	}
	return nil
}
