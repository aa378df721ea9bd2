package redlock

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/fencekit/fence/internal/pause"
	"github.com/fencekit/fence/internal/resend"
	"github.com/redis/go-redis/v9"
)

// Defaults for Options.
const (
	DefaultPrefix      = "redlock"
	DefaultWatchdogTTL = 30 * time.Second
	DefaultRetryDelay  = 100 * time.Millisecond

	// DefaultConnectTimeout bounds a node's first contact (dial, TLS
	// handshake, AUTH, a PING), made before a Locker's first acquisition
	// is timed: see Options.NodeTimeout.
	DefaultConnectTimeout = 2 * time.Second
	// DefaultStatusTimeout bounds Status on each node when the caller's
	// context has no earlier deadline.
	DefaultStatusTimeout = 5 * time.Second
)

// The default per-node timeout of a lease of lease time ttl is ttl/20,
// but at least minNodeTimeout and at most maxNodeTimeout (and never more
// than the lease time less the drift allowance): see Options.NodeTimeout.
const (
	nodeTimeoutShare = 20
	minNodeTimeout   = 100 * time.Millisecond
	maxNodeTimeout   = time.Second
)

// DefaultNodeTimeout is the per-node timeout a Locker with the default
// Options.NodeTimeout gives a request for a lease of lease time ttl:
// ttl/20, at least 100 ms and at most 1 s; 500 ms for a 10 s lease, 1 s for
// the default watchdog TTL of 30 s. It is capped, as every node timeout
// is, at the lease time less the drift allowance.
func DefaultNodeTimeout(ttl time.Duration) time.Duration {
	return capNodeTimeout(min(max(ttl/nodeTimeoutShare, minNodeTimeout), maxNodeTimeout), ttl)
}

// Options configure a Locker. The zero value (or nil) gives the defaults.
type Options struct {
	// Prefix starts every key fence writes on the nodes, followed by the
	// lock name in braces: "redlock:{payment:1001}". Default "redlock".
	Prefix string

	// WatchdogTTL is the lease time of leases acquired without fence.TTL;
	// the watchdog renews them every third of it. Default 30 s.
	WatchdogTTL time.Duration

	// NodeTimeout bounds each request to each node (acquisition,
	// write-back, renewal, release). Default: scaled with the lease
	// time, DefaultNodeTimeout(ttl) (ttl/20, between 100 ms and 1 s).
	//
	// The node timeout is not what makes a lease safe: the validity check
	// is. Whatever the timeout, an acquisition is refused (ErrValidity)
	// when the nodes' replies, counted from before the first request was
	// sent, left no lease time over the drift allowance, and the lease's
	// Deadline is that validity. The timeout decides availability: how
	// much of the lease time a node that is down, hung or partitioned
	// costs every acquisition (the others wait for it until it runs out),
	// against how slow a healthy node may be before it is counted out. A
	// fixed few milliseconds (the Redis documentation's "5–50 ms for a
	// 10 s auto-release time") counts out healthy nodes on a loaded host
	// or across a slow network, and fails acquisitions that had plenty of
	// lease time to spare. A twentieth of the lease time costs at most 5%
	// of it, and is long enough for a round trip on any network the lease
	// time suits; the floor of 100 ms (a larger share of leases under 2 s)
	// allows for a loaded host, the cap of 1 s keeps a hung node from
	// costing long leases seconds on every acquisition. A request is never
	// given longer than the lease time less the drift allowance.
	//
	// A node's first contact, its dial (with TLS and AUTH, several round
	// trips), is not counted against the node timeout: before a Locker's
	// first acquisition it pings every node (INFO server, which also
	// tells a server listed twice: see AliasError), all at once, within
	// DefaultConnectTimeout (2 s) or the caller's deadline, and only then
	// starts timing the acquisition. Each node is pinged so once, whatever
	// it answers: a node down at the start costs that bound once, not on
	// every acquisition. Connections dialled later (more concurrent
	// requests than pooled connections, a redial after an error or an idle
	// timeout) count against the node timeout.
	NodeTimeout time.Duration

	// RetryDelay is the mean pause between two tries of a waiting
	// Acquire; each pause is drawn at random between a half and one and a
	// half of it, so that contenders do not retry in step and split the
	// nodes between them again. Default 100 ms.
	RetryDelay time.Duration

	// Observer, if not nil, is told of every acquisition and the end of
	// every lease, with Backend "redlock"; see fence.Observer.
	Observer fence.Observer

	// Logger, if not nil, receives a warning when a lease is lost (with
	// the lock name, token and cause) and when a watchdog renewal fails to
	// reach a majority. Nil logs nothing. Credentials never appear in it:
	// the lines carry names, tokens, causes and errors.
	Logger *slog.Logger

	_ struct{} // forbids positional literals
}

// Locker grants fenced leases held on a majority of independent Redis
// masters (Redlock). It is safe for concurrent use. Some of its work goes
// on after the call that started it has returned (Release returns once a
// majority deleted the lock, the other nodes' deletes go on): call Close
// before the program exits.
type Locker struct {
	nodes       []redis.UniversalClient
	quorum      int
	prefix      string
	watchdog    time.Duration
	nodeTimeout time.Duration // 0: DefaultNodeTimeout of the lease time
	// resendAfter[i] is how long a request to node i must have taken for
	// its client to have sent it again (resend.Through; 0: it never does).
	resendAfter []time.Duration
	retryDelay  time.Duration
	obs         fence.Observer // nil: none
	log         *slog.Logger   // nil: none

	// allNodes lists every node's index; read only.
	allNodes []int
	// lastKeys caches the keys of the last name acquired, so that a lock
	// taken again and again (the usual case) does not build its key strings
	// on every try; one entry, so it never grows.
	lastKeys atomic.Pointer[keys]

	// work hands a request to an idle worker (see spawn); unbuffered.
	work chan func()

	// bg is the work that goes on after its call returned, which Close
	// waits for, and the leases Close releases.
	bg background

	// reached[i] is set once node i was pinged for a first contact,
	// whatever it answered: later acquisitions no longer ping it first.
	reached []atomic.Bool
	// runID[i] is node i's server run_id, read at its first contact (nil:
	// not read); aliasOf[i] is j+1 when node j < i has the same run_id
	// (one server listed twice under names New cannot compare): node i's
	// grants are not counted.
	runID   []atomic.Pointer[string]
	aliasOf []atomic.Int32

	// beforeReplies, if set (tests only), runs after an acquisition's
	// requests were sent and before their replies are read: a client
	// paused at the worst moment.
	beforeReplies func()
	// expiryFired, if set (tests only), runs when a lease's expiry timer
	// has fired and found the deadline not moved, before it ends the
	// lease: a renewal's replies read at that moment.
	expiryFired func()
	// leaseStarted, if set (tests only), runs when an acquisition has
	// started its lease, before it lists it for Close: a busy machine
	// between the two.
	leaseStarted func(fence.Lease)
	// now is the clock that times an acquisition against its validity;
	// tests move it.
	now func() time.Time
	// wall is the clock from which an acquisition proposes its token
	// floor; tests set it wrong, as a client's wall clock can be (which
	// leaves the monotonic clock that times leases alone).
	wall func() time.Time
}

var _ fence.Locker = (*Locker)(nil)

// New returns a Locker over the independent Redis masters that clients
// reach, one client per master (a *redis.Client each, usually; never
// replicas of one another). It needs Redis 7.0 or newer on every node and
// sends nothing to them. opts may be nil.
//
// It returns an error matching fence.ErrInvalidOption when clients is
// empty, holds a nil client or the same client twice, two clients to the
// same address (a *DuplicateNodeError), or an option is out of range.
func New(clients []redis.UniversalClient, opts *Options) (*Locker, error) {
	if len(clients) == 0 {
		return nil, fmt.Errorf("%w: redlock: no clients", fence.ErrInvalidOption)
	}
	for i, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("%w: redlock: client %d is nil", fence.ErrInvalidOption, i)
		}
		if v := reflect.ValueOf(c); v.Kind() == reflect.Pointer && v.IsNil() {
			return nil, fmt.Errorf("%w: redlock: client %d is nil (%T)", fence.ErrInvalidOption, i, c)
		}
		for j := range i {
			if clients[j] == c {
				return nil, fmt.Errorf("%w: redlock: clients %d and %d are the same client", fence.ErrInvalidOption, j, i)
			}
		}
	}
	if err := distinctAddrs(clients); err != nil {
		return nil, err
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if err := fence.ValidateObserver(o.Observer); err != nil {
		return nil, fmt.Errorf("redlock: %w", err)
	}
	l := &Locker{
		nodes:       append([]redis.UniversalClient(nil), clients...),
		quorum:      len(clients)/2 + 1,
		prefix:      cmp.Or(o.Prefix, DefaultPrefix),
		watchdog:    cmp.Or(o.WatchdogTTL, DefaultWatchdogTTL),
		nodeTimeout: o.NodeTimeout,
		retryDelay:  cmp.Or(o.RetryDelay, DefaultRetryDelay),
		obs:         o.Observer,
		log:         o.Logger,
		reached:     make([]atomic.Bool, len(clients)),
		runID:       make([]atomic.Pointer[string], len(clients)),
		aliasOf:     make([]atomic.Int32, len(clients)),
		work:        make(chan func()),
		allNodes:    make([]int, len(clients)),
		now:         time.Now,
		wall:        time.Now,
	}
	for i := range l.allNodes {
		l.allNodes[i] = i
	}
	l.resendAfter = make([]time.Duration, len(clients))
	for i, c := range clients {
		// redlock sends its scripts through the client itself: a
		// ClusterClient resends them through MaxRedirects too.
		l.resendAfter[i] = resend.Through(c)
	}
	l.bg.init(len(clients))
	if strings.ContainsAny(l.prefix, "{}") || fence.ValidateName(l.prefix) != nil {
		return nil, fmt.Errorf("%w: redlock: prefix %q must be a valid lock name", fence.ErrInvalidOption, l.prefix)
	}
	if err := fence.ValidateTTL(l.watchdog); err != nil {
		return nil, fmt.Errorf("redlock: watchdog TTL: %w", err)
	}
	if o.NodeTimeout != 0 && l.nodeTimeout < time.Millisecond {
		return nil, fmt.Errorf("%w: redlock: node timeout %v is shorter than 1ms", fence.ErrInvalidOption, l.nodeTimeout)
	}
	if l.retryDelay < time.Millisecond {
		return nil, fmt.Errorf("%w: redlock: retry delay %v is shorter than 1ms", fence.ErrInvalidOption, l.retryDelay)
	}
	return l, nil
}

// DuplicateNodeError means that two of the clients given to New reach the
// same address: one server would count twice towards a majority (with a
// third client, two of three "nodes" would be one real node). It matches
// fence.ErrInvalidOption.
type DuplicateNodeError struct {
	Addr          string // the address, as the second client spells it
	First, Second int    // the clients' positions
}

func (e *DuplicateNodeError) Error() string {
	return fmt.Sprintf("%v: redlock: clients %d and %d reach the same server, %s", fence.ErrInvalidOption, e.First, e.Second, e.Addr)
}

// Unwrap returns fence.ErrInvalidOption.
func (e *DuplicateNodeError) Unwrap() error { return fence.ErrInvalidOption }

// distinctAddrs refuses clients that reach the same address, whatever their
// database. It compares addresses as written, up to case, an empty or
// "localhost" host against the loopback addresses, and IP spellings; it
// resolves no names, so two names of one host get past it. Clients that do
// not tell their address (Options) are not compared, nor are Sentinel
// failover clients: go-redis gives each the address "FailoverClient", and
// three of distinct primaries were refused as one server given twice
// (TestFailoverClientNodes).
func distinctAddrs(clients []redis.UniversalClient) error {
	seen := make(map[string]int, len(clients))
	for i, c := range clients {
		o, ok := c.(interface{ Options() *redis.Options })
		if !ok || o.Options() == nil || o.Options().Addr == failoverAddr {
			continue
		}
		key := canonicalAddr(o.Options().Network, o.Options().Addr)
		if j, ok := seen[key]; ok {
			return &DuplicateNodeError{Addr: o.Options().Addr, First: j, Second: i}
		}
		seen[key] = i
	}
	return nil
}

// failoverAddr is the address go-redis puts in a Sentinel failover
// client's Options, whichever primary it reaches.
const failoverAddr = "FailoverClient"

// canonicalAddr spells a go-redis address one way: an empty host,
// 127.0.0.1 and ::1 as "localhost", IPs in their canonical form, names in lower case.
func canonicalAddr(network, addr string) string {
	if network == "unix" {
		return "unix:" + filepath.Clean(addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "tcp:" + strings.ToLower(addr)
	}
	host = strings.ToLower(host)
	if ip := net.ParseIP(host); ip != nil {
		host = ip.String()
		if ip.Equal(net.IPv4(127, 0, 0, 1)) || ip.Equal(net.IPv6loopback) {
			host = "localhost"
		}
	}
	if host == "" {
		host = "localhost"
	}
	return "tcp:" + net.JoinHostPort(host, port)
}

// Quorum is how many nodes must grant a lock: a majority, len(clients)/2+1.
func (l *Locker) Quorum() int { return l.quorum }

// keys are the keys of one lock name on every node.
type keys struct {
	name  string // the lock name
	lock  string // holds the owner id, with the lease's expiry
	token string // the last token this node issued or was told of; no expiry
}

func (l *Locker) keys(name string) keys {
	if k := l.lastKeys.Load(); k != nil && k.name == name {
		return *k
	}
	base := l.prefix + ":{" + name + "}"
	k := keys{name: name, lock: base, token: base + ":token"}
	l.lastKeys.Store(&k)
	return k
}

// drift is the allowance for the clocks of the client and of the nodes
// running at different rates, as the Redlock algorithm specifies: 1% of the
// lease time plus 2 ms.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// timeoutFor is the per-node timeout of a request for a lease of ttl: the
// node timeout set, or else the default for ttl.
func (l *Locker) timeoutFor(ttl time.Duration) time.Duration {
	if l.nodeTimeout == 0 {
		return DefaultNodeTimeout(ttl)
	}
	return capNodeTimeout(l.nodeTimeout, ttl)
}

// capNodeTimeout caps a node timeout for a lease of ttl: a reply later than
// the lease time less the drift would be of no use.
func capNodeTimeout(d, ttl time.Duration) time.Duration {
	return max(min(d, ttl-drift(ttl)), time.Millisecond)
}

// connect pings, all at once, the nodes this Locker has not tried to reach
// yet, within DefaultConnectTimeout or ctx's deadline, so that their dials
// are not counted against an acquisition's node timeout. Each node is
// pinged once, whatever it answers (unless ctx ended the ping): a node
// down or partitioned costs this bound once, not on every acquisition.
// Errors are left to the acquisition to find.
func (l *Locker) connect(ctx context.Context) {
	var todo []int
	for i := range l.nodes {
		if !l.reached[i].Load() {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return
	}
	// INFO server dials as PING would, and tells the server's run_id: two
	// clients that reach one server under names distinctAddrs cannot
	// compare (a second DNS name, a proxy) on different databases would
	// otherwise both grant a lock, one server counted twice towards a
	// majority (on one database the second finds the try's own lock, and
	// errRanTwice keeps it out). A node whose INFO fails (down, or an ACL
	// user without it) is not compared.
	l.fanout(ctx, todo, DefaultConnectTimeout, func(ctx context.Context, i int) ([]int64, error) {
		info, err := l.nodes[i].Info(ctx, "server").Result()
		if err == nil {
			if id := infoField(info, "run_id"); id != "" {
				l.runID[i].Store(&id)
			}
		}
		return nil, err
	})
	if ctx.Err() != nil {
		return
	}
	for _, i := range todo {
		id := l.runID[i].Load()
		for j := range l.nodes {
			if o := l.runID[j].Load(); j != i && id != nil && o != nil && *o == *id {
				l.aliasOf[max(i, j)].Store(int32(min(i, j)) + 1)
			}
		}
		l.reached[i].Store(true)
	}
}

// infoField returns field's value in an INFO reply, or "".
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// AliasError is the error of a node that the first contact found to be
// the same server (the same run_id) as an earlier node, under another
// address: it never counts towards a majority, and its requests are not
// sent.
type AliasError struct {
	Node, Of int // the clients' positions
}

func (e *AliasError) Error() string {
	return fmt.Sprintf("node %d: redlock: the same server as node %d (same run_id): not counted", e.Node, e.Of)
}

// ErrBadTokenRecord means a node's last-token record of a lock name holds
// something the acquire script cannot increase exactly: not a canonical
// decimal integer, or 2^53 - 1 or more. fence never writes such a record;
// the error names the key. Acquire wraps it in an error matching
// fence.ErrNotAcquired and does not retry.
var ErrBadTokenRecord = errors.New("redlock: bad token record")

// ErrValidity means that the nodes granted the lock, but so late that no
// lease time was left once the drift allowance was taken off: the
// acquisition is released on every node. A waiting Acquire tries again.
var ErrValidity = errors.New("redlock: no validity time left")

// ErrNoQuorum means fewer than a majority of the nodes answered a request
// in time with a usable reply; the error joins each node's error.
var ErrNoQuorum = errors.New("redlock: no quorum")

// errNoReply is the error of a node that did not answer within the per-node
// timeout. It is a net.Error whose Timeout is true, as a read deadline's
// is, so that a caller tells a node that did not answer from one that
// answered an error: fence status labelled it "answered, not read"
// (TestStatusRedlockTLSFailureAnswered).
var errNoReply error = noReplyError{}

type noReplyError struct{}

func (noReplyError) Error() string   { return "no reply in time" }
func (noReplyError) Timeout() bool   { return true }
func (noReplyError) Temporary() bool { return true }

// Acquire takes the lock called name on a majority of the nodes; see
// fence.Locker and the package doc. Each try is decided as soon as a
// majority has granted it, or can no longer grant it, without waiting for
// the other nodes' replies (they are read afterwards). The returned error wraps fence.ErrHeld
// when a node reported the lock held by another owner in the last try, the
// caller's context error when it ended the call, and otherwise ErrNoQuorum,
// ErrValidity or ErrBadTokenRecord with the nodes' errors.
func (l *Locker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	if ctx == nil {
		return nil, nilctx.Err("redlock", "Acquire")
	}
	if l == nil || l.obs == nil {
		return l.acquire(ctx, name, opts...)
	}
	start := time.Now()
	lease, err := l.acquire(ctx, name, opts...)
	fence.ReportAcquire(l.obs, backend, name, start, lease, err)
	return lease, err
}

// backend is the Backend of the events this package reports.
const backend = "redlock"

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
	if l.bg.closed.Load() {
		return nil, fence.NotAcquired(name, ErrClosed)
	}
	ttl, watchdog := o.TTL, false
	if ttl == 0 {
		ttl, watchdog = l.watchdog, true
	}
	// The wait budget bounds the tries through waitCtx. A first try
	// cannot outlast a budget longer than the first contact's bound plus
	// two fan-outs (the acquisition and the write-back; a failed try's
	// release is not bound by it), with room to spare: then the first try
	// runs on ctx, and waitCtx is made only if a second is needed, with
	// the same deadline. An acquisition that succeeds at once (the usual
	// case) so makes no context and no timer for its budget.
	waitCtx, budget, lazy := ctx, time.Time{}, false
	if o.Wait > 0 {
		budget = time.Now().Add(o.Wait)
		lazy = o.Wait >= DefaultConnectTimeout+4*l.timeoutFor(ttl)
		if !lazy {
			var cancel context.CancelFunc
			waitCtx, cancel = context.WithDeadline(ctx, budget)
			defer cancel()
		}
	}
	var (
		timer *time.Timer
		last  error // why the last try that the budget did not cut short failed
	)
	for {
		ls, why := l.try(waitCtx, name, ttl, watchdog)
		switch {
		case ls != nil:
			return ls, nil
		case ctx.Err() != nil:
			return nil, fence.NotAcquired(name, ctx.Err())
		case o.Wait == 0 || errors.Is(why, ErrBadTokenRecord) || errors.Is(why, fence.ErrClosed):
			return nil, fence.NotAcquired(name, why)
		case waitCtx.Err() != nil && last != nil:
			// The budget ended during this try: the one before says
			// why better than the timeouts that cut this one short.
			return nil, fence.NotAcquired(name, last)
		case waitCtx.Err() != nil:
			return nil, fence.NotAcquired(name, why)
		}
		last = why
		if lazy {
			lazy = false
			var cancel context.CancelFunc
			waitCtx, cancel = context.WithDeadline(ctx, budget)
			defer cancel()
			if waitCtx.Err() != nil {
				return nil, fence.NotAcquired(name, last)
			}
		}
		pause := l.retryDelay/2 + mrand.N(l.retryDelay)
		if timer == nil {
			timer = time.NewTimer(pause)
			defer timer.Stop()
		} else {
			timer.Reset(pause)
		}
		select {
		case <-timer.C:
		case <-waitCtx.Done():
			if ctx.Err() != nil {
				return nil, fence.NotAcquired(name, ctx.Err())
			}
			return nil, fence.NotAcquired(name, last)
		}
	}
}

// result is one node's reply to a script.
type result struct {
	res []int64
	err error
	at  time.Time // when the reply came (the script ran before)
	got bool      // the reply came in time (fanout)
}

// fanout runs call on the nodes listed (by index) all at once, each bounded
// by timeout, and returns their results in the order listed. A node that
// has not answered by the timeout gets an error wrapping errNoReply; its call
// goes on in its goroutine (the client's own timeouts end it) and its late
// reply is dropped. (An acquisition's requests go through tryFanout, whose
// late replies are read.)
func (l *Locker) fanout(ctx context.Context, nodes []int, timeout time.Duration, call func(ctx context.Context, node int) ([]int64, error)) []result {
	// Each request writes its own slot and marks it done; the last to
	// answer wakes the caller, once, rather than every reply waking it.
	type slot struct {
		r    result
		done atomic.Bool // r is written, and never written again
	}
	f := &struct {
		slots []slot
		left  atomic.Int32 // requests not answered yet
		all   chan struct{}
	}{slots: make([]slot, len(nodes)), all: make(chan struct{})}
	f.left.Store(int32(len(nodes)))
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for k, i := range nodes {
		l.spawn(func() {
			res, err := call(cctx, i)
			f.slots[k].r = result{res: res, err: err, at: time.Now()}
			f.slots[k].done.Store(true)
			if f.left.Add(-1) == 0 {
				close(f.all)
			}
		})
	}
	select {
	case <-f.all:
	case <-cctx.Done():
	}
	// Replies that came as the time ran out still count; a slot not
	// marked done is not read (its request may write it later).
	out := make([]result, len(nodes))
	for k := range f.slots {
		if f.slots[k].done.Load() {
			out[k], out[k].got = f.slots[k].r, true
		}
	}
	for k, i := range nodes {
		out[k].err = replyError(ctx, i, out[k], timeout)
	}
	return out
}

// replyError is the error a call reports for node i's reply r (nil when it
// came without one): ctx's, if it ended the wait; errNoReply, if the reply
// did not come within the per-node timeout (not the caller's deadline: it
// keeps context.DeadlineExceeded out of the chain); else the node's.
func replyError(ctx context.Context, i int, r result, timeout time.Duration) error {
	switch err := r.err; {
	case ctx.Err() != nil && (!r.got || err != nil):
		return fmt.Errorf("node %d: %w", i, ctx.Err())
	case !r.got || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("node %d: %w within %v", i, errNoReply, timeout)
	case err != nil:
		return fmt.Errorf("node %d: %w", i, nodeError(err))
	}
	return nil
}

// workerIdle is how long a worker waits for another request before it
// exits: long enough to serve an application's next acquisition or release
// (the usual case: locks taken again and again), short enough that nothing
// lingers for long after the last.
const workerIdle = 100 * time.Millisecond

// spawn runs f in a goroutine: an idle worker's, left by an earlier
// request, or a new one. A worker's stack has already grown to what a
// request through go-redis needs, so reusing one spares the new
// goroutine's stack growth (copying its stack, several times) on every
// request, the largest cost of a fan-out after the system calls. A worker
// exits after workerIdle without a request.
func (l *Locker) spawn(f func()) {
	select {
	case l.work <- f:
	default:
		go l.worker(f)
	}
}

// worker runs f, then the requests handed to it, until it has been idle
// for workerIdle.
func (l *Locker) worker(f func()) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(workerIdle)
		select {
		case f = <-l.work:
		case <-idle.C:
			return
		}
	}
}

// nodeError turns the acquire script's refusal into ErrBadTokenRecord and
// leaves other errors as they are.
func nodeError(err error) error {
	if redis.HasErrorPrefix(err, "FENCETOKEN") {
		return fmt.Errorf("%w: %s", ErrBadTokenRecord, err.Error()[len("FENCETOKEN "):])
	}
	return err
}

// all lists every node's index. The slice is shared: do not modify it.
func (l *Locker) all() []int { return l.allNodes }

// Replies of the scripts that answer 0 or 1, shared (read only) rather
// than allocated per reply.
var (
	reply0 = []int64{0}
	reply1 = []int64{1}
)

// oneReply is the shared reply slice for n, which must be 0 or 1.
func oneReply(n int64) []int64 {
	if n == 1 {
		return reply1
	}
	return reply0
}

// try asks every node for the lock once, with a new owner id. It returns
// the lease when a majority granted it within its validity time and took
// its token; otherwise it releases the try on every node and says why.
func (l *Locker) try(ctx context.Context, name string, ttl time.Duration, watchdog bool) (*lease, error) {
	// A try under way is waited for by Close (its lease, if Close
	// overtook it, is released here, and that release's work is Close's
	// to wait for); once Close was called, no try starts.
	if !l.bg.enter() {
		return nil, ErrClosed
	}
	defer l.bg.leave()
	k, owner := l.keys(name), newOwner()
	revokeKey := k.lock + ":revoked:" + owner
	timeout := l.timeoutFor(ttl)
	l.connect(ctx)
	if l.bg.closed.Load() {
		// Close was called while the first contact waited for a node:
		// nothing was sent that needs giving back.
		return nil, ErrClosed
	}
	start := l.now()
	floor := l.wall().Add(floorLead).UnixMicro()
	// The same keys and arguments go to every node (go-redis copies them
	// into each command): built once, not once per node.
	acqKeys := []string{k.lock, k.token, revokeKey}
	acqArgs := []any{owner, ttl.Milliseconds(), floor, floorCapArg}
	at := l.send(ctx, k, owner, ttl, timeout, acqKeys, acqArgs)
	rs := at.await(ctx, l.beforeReplies)
	var (
		granted []int
		token   int64
		held    int
		closed  int // nodes whose client the user closed
		errs    []error
	)
	for i, r := range rs {
		switch {
		case r.err != nil:
			errs = append(errs, r.err)
			if errors.Is(r.err, redis.ErrClosed) {
				closed++
			}
		case isGrant(r.res):
			granted = append(granted, i)
			token = max(token, r.res[1])
		case isOwn(r.res):
			errs = append(errs, fmt.Errorf("node %d: %w", i, errRanTwice))
		case len(r.res) == 2 && r.res[0] == 0:
			held++
		default:
			errs = append(errs, fmt.Errorf("node %d: unexpected reply %v", i, r.res))
		}
	}
	fail := func(why error) (*lease, error) {
		// Every reply come so far, late ones too: the nodes that have
		// not answered yet are revoked, and a grant that comes after this
		// is given back by the request that brings it.
		tried := at.abandon()
		l.releaseTry(ctx, at, tried)
		return nil, why
	}
	if len(granted) < l.quorum {
		why := fmt.Errorf("%w: %d of %d nodes granted the lock, %d needed", ErrNoQuorum, len(granted), len(l.nodes), l.quorum)
		switch {
		case len(l.nodes)-closed < l.quorum:
			// No majority is left: the Locker can grant no more
			// leases, and fence.Lead stops campaigning on it.
			why = fmt.Errorf("%w: the clients of %d of %d nodes were closed (%w)", ErrNoQuorum, closed, len(l.nodes), fence.ErrClosed)
		case held > 0:
			why = fmt.Errorf("%w: on %d of %d nodes", fence.ErrHeld, held, len(l.nodes))
		}
		if elapsed := l.now().Sub(start); elapsed >= ttl-drift(ttl) {
			// The lease time ran out first (the client was paused, say,
			// and its node timeout fired before it read the replies
			// waiting for it): that is the first reason.
			why = errors.Join(fmt.Errorf("%w: the try took %v of a lease time of %v (drift allowance %v)", ErrValidity, elapsed, ttl, drift(ttl)), why)
		}
		return fail(errors.Join(append([]error{why}, errs...)...))
	}
	// Every later majority shares a node with this one: the granting
	// nodes that answered a smaller token are told the lease's token, so
	// that every node of the majority issues a greater one next time.
	kept := 0
	var behind []int
	for _, i := range granted {
		if rs[i].res[1] == token {
			kept++ // its record holds the token already
		} else {
			behind = append(behind, i)
		}
	}
	errs = errs[:0]
	if len(behind) > 0 {
		ws := l.fanout(ctx, behind, timeout, func(ctx context.Context, i int) ([]int64, error) {
			n, err := maxScript.Run(ctx, l.nodes[i], []string{k.token, k.lock}, token, owner).Int64()
			return []int64{n}, err
		})
		for _, w := range ws {
			switch {
			case w.err != nil:
				errs = append(errs, w.err)
			case w.res[0] == 1:
				kept++
			}
		}
	}
	if kept < l.quorum {
		why := fmt.Errorf("%w: the token reached %d of the %d nodes that granted the lock, %d needed", ErrNoQuorum, kept, len(granted), l.quorum)
		return fail(errors.Join(append([]error{why}, errs...)...))
	}
	elapsed := l.now().Sub(start)
	if validity := ttl - elapsed - drift(ttl); validity <= 0 {
		return fail(fmt.Errorf("%w: the nodes took %v of a lease time of %v (drift allowance %v)", ErrValidity, elapsed, ttl, drift(ttl)))
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up while the try was out; it will not use
		// the lease.
		return fail(err)
	}
	ls := &lease{locker: l, name: name, keys: k, owner: owner, token: fence.Token(token), ttl: ttl,
		revokeKey: revokeKey, ungranted: make([]bool, len(l.nodes)), refs: make([]clockRef, len(l.nodes)),
		try: at, renewing: make(chan struct{}, 1), relOp: make(chan struct{}, 1)}
	for i, r := range rs {
		ls.ungranted[i] = r.err != nil
	}
	for _, i := range granted {
		ls.refs[i] = clockRef{nodeMs: rs[i].res[2], at: rs[i].at}
	}
	ls.start(ctx, watchdog, start)
	if f := l.leaseStarted; f != nil {
		f(ls)
	}
	at.hand(ls, rs)
	listed := l.bg.register(ls)
	// An end of the lease since it started (its deadline passed at the
	// start: its expiry timer fired at once) is reported only now, and
	// only if it was granted (TestCloseOvertakingExpiredAtGrantReportsNoLease).
	report := ls.listed(listed)
	if !listed {
		// Close was called while the try was out, and will not release
		// this lease: release it here (its background work is Close's
		// to wait for, as any). It was never granted: its end is not
		// reported. Waited for until ctx ends, as a failed try's release
		// is: the requests go on without the caller (a node that does not
		// answer is retried in the background), so nodes that hang do
		// not keep Acquire past its caller's deadline.
		_ = ls.Release(ctx)
		return nil, ErrClosed
	}
	report()
	if ls.Err() != nil {
		l.bg.forget(ls) // ended before it was listed (endLocked forgot it then)
	}
	return ls, nil
}

// floorLead is how far ahead of the client's clock the token floor it
// proposes lies: far enough that the nodes' own clock floors, read later
// and on other hosts, usually fall below it, so that the nodes answer the
// same token and need no write-back.
const floorLead = time.Second

// floorCap is how far past a node's own clock the client's floor may count
// there (acquire.lua): a client whose clock is within floorCap − floorLead
// (a second) ahead of a node's clock, or behind it, still has its floor
// counted in full, so all nodes answer the same token; a client whose clock
// is hours ahead makes tokens at most floorCap ahead of the nodes' clocks,
// not hours ahead (a resource that refuses tokens too far ahead, such as
// guard with MaxAhead, would refuse every holder's until the clocks caught
// up, and the records would creep towards 2^53).
const floorCap = 2 * time.Second

// floorCapArg is floorCap in µs, the acquire script's ARGV[4], boxed once.
var floorCapArg any = floorCap.Microseconds()

// revokeFor is how long the mark that revokes a try given up on lives on a
// node that did not answer it in time (release.lua).
const revokeFor = time.Minute

// releaseTry gives back a failed try on every node it was sent to, even
// when ctx has ended, each within the per-node timeout. It waits for the
// nodes that granted the try, until ctx ends (then they go on without it); a node that did not answer it (or answered an
// error) is revoked in the background, so that a node hung or down does not
// keep the caller, who may want to try again, waiting: the release there
// also leaves a revocation mark, since the try may still be sitting in its
// socket, and must refuse when it runs; and if the try's grant comes after
// all, it is given back when it comes (tryFanout.reply).
//
// A node whose release fails (paused, its connections busy, the network
// cut) may still run the try later, or hold the lock it took: its release,
// with the revocation mark, is retried in the background, with back-off,
// within the lease time (after which the lock, if taken, has run out by
// itself). A node that refuses the connection is down, and may come back
// from its AOF with the lock: it is retried too, until Close
// (parkRelease).
func (l *Locker) releaseTry(ctx context.Context, at *tryFanout, tried []result) {
	k, owner, revokeKey, ttl := at.k, at.owner, at.acqKeys[2], at.ttl
	timeout := l.timeoutFor(ttl)
	var granted []int
	for i, r := range tried {
		switch {
		case r.err != nil || len(r.res) < 2:
			l.bg.add(i)
			l.spawn(func() {
				defer l.bg.done(i)
				l.revokeTry(i, k, owner, revokeKey, ttl, timeout)
			})
		case isOwn(r.res):
			// The try's own lock, from an earlier run of it there:
			// given back like a grant.
			granted = append(granted, i)
		case r.res[0] == 0 && r.res[1] != -2 && at.resent.Load():
			// Held by another owner, but a request of the try may have
			// been sent twice: a copy still on its way would take the
			// lock once that owner releases it. Revoked, as a node
			// that did not answer is
			// (TestDelayedAcquisitionCopyHeldNodeFailedTry).
			l.bg.add(i)
			l.spawn(func() {
				defer l.bg.done(i)
				l.revokeTry(i, k, owner, revokeKey, ttl, timeout)
			})
		case r.res[0] == 0:
			// Held by another owner, or the try was revoked there:
			// nothing of ours.
		default:
			granted = append(granted, i)
		}
	}
	if len(granted) == 0 {
		return
	}
	// Each release runs within the node timeout whatever ctx does; the
	// caller waits for them only until ctx ends (a caller's deadline
	// shorter than the node timeout is kept even when a node that granted
	// hangs): the releases not done by then go on without it.
	relKeys, relArgs := at.relKeys()
	l.releaseBehind(ctx, granted, timeout, relKeys, relArgs, func(i int, err error) {
		l.retryRelease(err, i, k, owner, revokeKey, ttl, 0)
	})
}

// releaseBehind sends the owner-checked release (keys, args) to each of
// nodes, each within timeout whatever ctx does, as background work that
// Close waits for, and waits for them until ctx ends: the releases not
// done by then go on without the caller. failed, if not nil, gets each
// release that failed.
func (l *Locker) releaseBehind(ctx context.Context, nodes []int, timeout time.Duration, keys []string, args []any, failed func(i int, err error)) {
	done := make(chan struct{})
	var left atomic.Int32
	left.Store(int32(len(nodes)))
	for _, i := range nodes {
		l.bg.add(i)
		l.spawn(func() {
			defer l.bg.done(i)
			rctx, cancel := context.WithTimeout(context.Background(), timeout)
			err := releaseScript.Run(rctx, l.nodes[i], keys, args...).Err()
			cancel()
			if err != nil && failed != nil {
				failed(i, err)
			}
			if left.Add(-1) == 0 {
				close(done)
			}
		})
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// revokeTry releases a try on node i, which did not answer it, with the
// revocation mark, within timeout; if the node does not answer that
// either, it is retried in the background (releaseAbandoned).
func (l *Locker) revokeTry(i int, k keys, owner, revokeKey string, ttl, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	err := releaseScript.Run(ctx, l.nodes[i], []string{k.lock, revokeKey}, owner, max(ttl, revokeFor).Milliseconds()).Err()
	cancel()
	if err != nil {
		l.retryRelease(err, i, k, owner, revokeKey, ttl, 0)
	}
}

// retryRelease retries in the background, after err, a release on node
// i: parked (parkRelease) if the node refused the connection, for Close
// to wait for (goReleaseAbandoned) otherwise.
func (l *Locker) retryRelease(err error, i int, k keys, owner, revokeKey string, ttl time.Duration, token int64) {
	if errors.Is(err, syscall.ECONNREFUSED) {
		l.parkRelease(i, k, owner, revokeKey, ttl, token)
		return
	}
	l.goReleaseAbandoned(i, k, owner, revokeKey, ttl, token)
}

// goReleaseAbandoned runs releaseAbandoned in a goroutine of its own,
// counted as background work for Close.
func (l *Locker) goReleaseAbandoned(i int, k keys, owner, revokeKey string, ttl time.Duration, token int64) {
	l.bg.add(i)
	go func() {
		defer l.bg.done(i)
		l.releaseAbandoned(i, k, owner, revokeKey, ttl, token)
	}()
}

// releaseArgs returns the keys and arguments of the release, with the
// revocation mark, of a try given up on (see releaseAbandoned).
func releaseArgs(k keys, owner, revokeKey string, ttl time.Duration, token int64) ([]string, []any) {
	keys := []string{k.lock, revokeKey}
	args := []any{owner, max(ttl, revokeFor).Milliseconds()}
	if token != 0 {
		keys = append(keys, k.token)
		args = append(args, token)
	}
	return keys, args
}

// releaseAbandoned retries the release, with the revocation mark, of a try
// given up on, on node i, until the node answers, or the lease time has
// passed (at least a second), or the client is closed (nothing can be sent
// through it any more), or Close gave up waiting. A refused connection
// hands the retries over to parkRelease. Each attempt may take what is
// left of that time: go-redis tells a refused connection only once its
// own dial retries are over, a second or two.
//
// token, if not 0, is the token of the lease the try became: the retry
// raises the node's last-token record to it, as Release's revocation does
// (release.lua). The acquisition may run on the node before the retry (it
// sat in a paused node's socket), and issue a token of its own, smaller,
// that nobody reads: left so, a later majority of this node and one that
// lost its record would issue a token below the lease's.
func (l *Locker) releaseAbandoned(i int, k keys, owner, revokeKey string, ttl time.Duration, token int64) {
	ctx, cancel := context.WithTimeout(l.bg.ctx, max(ttl, time.Second))
	defer cancel()
	keys, args := releaseArgs(k, owner, revokeKey, ttl, token)
	for failures := 1; ; failures++ {
		if !pauseRetry(ctx, failures) {
			if errors.Is(ctx.Err(), context.Canceled) {
				l.bg.stop(i) // Close gave up: a later one reports it
			}
			return
		}
		err := releaseScript.Run(ctx, l.nodes[i], keys, args...).Err()
		switch {
		case err == nil || errors.Is(err, redis.ErrClosed) || errors.Is(err, net.ErrClosed):
			return
		case errors.Is(err, syscall.ECONNREFUSED):
			l.parkRelease(i, k, owner, revokeKey, ttl, token)
			return
		case ctx.Err() != nil:
			if errors.Is(ctx.Err(), context.Canceled) {
				l.bg.stop(i)
			}
			return
		}
	}
}

// pauseRetry waits before the given attempt, with back-off from 10 ms to
// a second, jittered; it reports false if ctx ended first.
func pauseRetry(ctx context.Context, failures int) bool {
	return pause.For(ctx, pause.Backoff(failures))
}

// parkRelease queues, for retrying, the release on node i that the node
// refused the connection for: it is down, and may come back within the
// lease time, from its AOF or RDB, still holding the lock
// (TestReleaseOnRestartingPersistentNode: with another node down, every
// Acquire then failed on a free majority for the lease time). One
// goroutine per node (drainParked) retries the node's queue, not one per
// release (TestManyParkedReleasesShareOneGoroutine: a hundred releases
// refused kept a hundred goroutines for the lease time). Each release is
// tried until the node answers it, its lease time has passed (at least a
// second), the client is closed, or Close is called: unlike the other
// background work, Close neither waits for them nor reports them (a node
// down for the rest of the lease would make every Close wait that long),
// and a Locker never closed ends them with the lease time.
func (l *Locker) parkRelease(i int, k keys, owner, revokeKey string, ttl time.Duration, token int64) {
	keys, args := releaseArgs(k, owner, revokeKey, ttl, token)
	if l.bg.parkPush(i, parkedRelease{keys: keys, args: args, until: time.Now().Add(max(ttl, time.Second))}) {
		go l.drainParked(i)
	}
}

// drainParked retries node i's parked releases, the first in the queue
// first, with back-off while the node refuses (or fails otherwise), and
// the next at once after one it answered, until none is left.
func (l *Locker) drainParked(i int) {
	b := &l.bg
	failures := 1
	for {
		r, ok := b.parkNext(i, time.Now())
		if !ok {
			return
		}
		if failures > 0 && !pauseRetry(b.park, failures) {
			continue // Close: parkNext drops them all
		}
		ctx, cancel := context.WithDeadline(b.park, r.until)
		err := releaseScript.Run(ctx, l.nodes[i], r.keys, r.args...).Err()
		cancel()
		switch {
		case err == nil:
			b.parkPop(i)
			failures = 0
		case errors.Is(err, redis.ErrClosed) || errors.Is(err, net.ErrClosed):
			b.parkClear(i)
		default:
			failures++
		}
	}
}

// newOwner returns 128 random bits, hex-encoded: the owner id of one try.
func newOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// made refuses a Locker that New did not make (a zero Locker, or a nil
// one): it has nothing to lock with, and Acquire panicked on it.
func (l *Locker) made() error {
	if l == nil || len(l.nodes) == 0 {
		return fmt.Errorf("%w: redlock: a Locker not made by New (zero or nil): use redlock.New", fence.ErrInvalidOption)
	}
	return nil
}
