package zklock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/fencekit/fence/internal/pause"
	"github.com/go-zookeeper/zk"
)

// DefaultRoot is the znode under which a Locker keeps its locks unless
// WithRoot says otherwise: the lock called name is the directory
// DefaultRoot/<name, escaped>, holding one node per holder and waiter.
const DefaultRoot = "/fence/locks"

// Locker takes locks on ZooKeeper through a connection that its user owns.
// It is safe for concurrent use; Lockers on the same root share their locks.
type Locker struct {
	conn           *zk.Conn
	sessionTimeout time.Duration
	root           string
	acl            []zk.ACL
	obs            fence.Observer   // nil: none
	log            *slog.Logger     // nil: none
	dialer         zk.Dialer        // the probe's; nil: net.DialTimeout
	st             *SessionTimeouts // WithSessionTimeouts's; nil: the probe
	stSet          bool             // WithSessionTimeouts was given (with nil: refused)

	// negotiated is the session timeout (ns) that the servers granted the
	// probe; 0 until a probe succeeded (see negotiate).
	negotiated atomic.Int64
	probeMu    sync.Mutex
	probing    chan struct{} // non-nil while a probe runs; closed when it ends

	listings   atomic.Int64 // getChildren calls, for the tests of the herd effect
	reported   atomic.Bool  // confirm has reported a lowered timeout
	probes     atomic.Int64 // probes started, for the tests
	background atomic.Int64 // cleanup goroutines and probe Closes running, for the tests
}

var _ fence.Locker = (*Locker)(nil)

// Option configures a Locker.
type Option func(*Locker)

// WithRoot sets the znode under which the locks live (default DefaultRoot).
// It must be an absolute path without a trailing slash that ZooKeeper
// accepts (no "." or ".." element, no control or private-use character,
// none outside the Basic Multilingual Plane); New refuses another with
// fence.ErrInvalidOption.
func WithRoot(path string) Option { return func(l *Locker) { l.root = path } }

// WithACL sets the ACL of the nodes the Locker creates (default
// zk.WorldACL(zk.PermAll)). New refuses an empty one, which ZooKeeper
// refuses on every create.
func WithACL(acl []zk.ACL) Option { return func(l *Locker) { l.acl = acl } }

// WithObserver makes the Locker tell obs of every acquisition and the end
// of every lease, with Backend "zookeeper"; see fence.Observer.
func WithObserver(obs fence.Observer) Option { return func(l *Locker) { l.obs = obs } }

// WithLogger makes the Locker log a warning to log when a lease is lost
// (with the lock name, token and cause) and when a check of a lease's node
// fails. Without it the Locker logs nothing. Credentials (a digest ACL's)
// never appear in it: the lines carry names, tokens, causes and errors.
func WithLogger(log *slog.Logger) Option { return func(l *Locker) { l.log = log } }

// New returns a Locker that takes its locks through conn. sessionTimeout is
// the one given to zk.Connect: a lease is known to be held only until that
// long after the Locker last heard from ZooKeeper (see the package doc), or
// the negotiated timeout if the servers lowered it (above their
// maxSessionTimeout, 20 ticks by default). New sends nothing. The Locker
// learns the negotiated timeout (see "The negotiated session timeout" in
// the package doc, and NegotiatedTimeout) exactly, at every
// (re)connection, from the connection's SessionTimeouts if given one with
// WithSessionTimeouts, the way to take:
//
//	st := zklock.NewSessionTimeouts(nil)
//	conn, events, err := zk.Connect(servers, sessionTimeout, zk.WithLogger(st))
//	locker, err := zklock.New(conn, sessionTimeout, zklock.WithSessionTimeouts(st))
//
// Without it, the first Acquire learns it with a short session of its own,
// once per Locker, which misses a timeout the servers lower later (the
// package doc says when): make one Locker per connection and keep it,
// rather than one per Acquire (each would open and close that session, two
// writes through the ensemble's quorum). The caller keeps owning conn, its
// event channel and its Close; a lease ends when conn is closed.
func New(conn *zk.Conn, sessionTimeout time.Duration, opts ...Option) (*Locker, error) {
	l := &Locker{conn: conn, sessionTimeout: sessionTimeout, root: DefaultRoot, acl: zk.WorldACL(zk.PermAll)}
	for _, opt := range opts {
		if opt != nil {
			opt(l)
		}
	}
	switch {
	case conn == nil:
		return nil, fmt.Errorf("%w: zklock: nil connection", fence.ErrInvalidOption)
	case sessionTimeout < fence.MinTTL:
		return nil, fmt.Errorf("%w: zklock: session timeout %v", fence.ErrInvalidOption, sessionTimeout)
	case l.stSet && l.st == nil:
		return nil, fmt.Errorf("%w: zklock: WithSessionTimeouts(nil)", fence.ErrInvalidOption)
	case len(l.acl) == 0:
		return nil, fmt.Errorf("%w: zklock: WithACL with no entry (ZooKeeper refuses to create a node with an empty ACL)", fence.ErrInvalidOption)
	case !validRoot(l.root):
		return nil, fmt.Errorf("%w: zklock: root %q is not an absolute znode path that ZooKeeper accepts", fence.ErrInvalidOption, l.root)
	}
	if err := fence.ValidateObserver(l.obs); err != nil {
		return nil, fmt.Errorf("zklock: %w", err)
	}
	return l, nil
}

// validRoot reports whether root is an absolute znode path that ZooKeeper
// accepts (its PathUtils.validatePath): no empty, "." or ".." element, no
// trailing slash, valid UTF-8 without control characters, and no character
// that Java holds as a surrogate pair or that the servers refuse (U+D800
// to U+F8FF, U+FFF0 and above). go-zookeeper checks only some of these
// before sending; a root it let through failed every Acquire on the
// servers' refusal, a backend error, instead of New refusing it.
func validRoot(root string) bool {
	if !strings.HasPrefix(root, "/") || !utf8.ValidString(root) {
		return false
	}
	for _, el := range strings.Split(root[1:], "/") {
		if el == "" || el == "." || el == ".." {
			return false
		}
		for _, r := range el {
			switch {
			case r <= 0x1f, 0x7f <= r && r <= 0x9f, 0xd800 <= r && r <= 0xf8ff, r >= 0xfff0:
				return false
			}
		}
	}
	return true
}

// attempt is one acquisition: the lock's directory and the guid that names
// this attempt's node, so that a create retried after a connection loss can
// find the node it may have made.
type attempt struct {
	name string
	dir  string // root + "/" + escaped name
	guid string
}

// nodePrefix is the path of the attempt's node before ZooKeeper appends the
// sequence number.
func (a *attempt) nodePrefix() string { return a.dir + "/" + a.guid + lockInfix }

// lockInfix separates an attempt's guid from the sequence number.
const lockInfix = "-lock-"

// Acquire takes the lock called name; see fence.Locker. It creates an
// ephemeral sequential node in the lock's directory and holds the lock when
// that node is the lowest; with a wait budget it watches only the node just
// before its own, so that each release wakes one waiter. The node is deleted
// if Acquire gives up. The token is the node's creation zxid.
func (l *Locker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	if ctx == nil {
		return nil, nilctx.Err("zklock", "Acquire")
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
	a := &attempt{name: name, dir: l.root + "/" + escape(name), guid: newGUID()}
	waitCtx, cancel := ctx, context.CancelFunc(func() {})
	if o.Wait > 0 {
		waitCtx, cancel = context.WithTimeout(ctx, o.Wait)
	}
	defer cancel()
	start := time.Now()
	if err := l.learn(ctx, waitCtx); err != nil {
		return nil, fence.NotAcquired(name, l.why(ctx, waitCtx, err))
	}
	lates := 0 // late takes in a row
	for {
		node, err := l.create(waitCtx, a)
		if err != nil {
			l.giveUp(ctx, a, node)
			return nil, fence.NotAcquired(name, l.why(ctx, waitCtx, err))
		}
		ls, err := l.await(ctx, waitCtx, a, node, o, start)
		if err != nil {
			l.giveUp(ctx, a, node)
			if errors.Is(err, errLateReply) && o.Wait > 0 && waitCtx.Err() == nil {
				// Given back: queue again, with a new node, within the
				// budget. A server too slow to answer within the lease
				// time is not sent a create, a read and a delete again
				// at once: back off (10 ms doubling to 1 s, jittered).
				lates++
				if pause.For(waitCtx, pause.Backoff(lates)) && waitCtx.Err() == nil {
					a = &attempt{name: name, dir: a.dir, guid: newGUID()}
					continue
				}
			}
			return nil, fence.NotAcquired(name, l.why(ctx, waitCtx, err))
		}
		return ls, nil
	}
}

// errLateReply is in the error of an Acquire whose node was first in line
// but whose read of it (the token) was answered past the lease's deadline:
// it gives no lease (see grant).
var errLateReply = fmt.Errorf("%w: the reply that took the lock came too late", fence.ErrLeaseLost) // matches fence.ErrLeaseLost: the lease ended before Acquire returned

// giveUp deletes the node of an attempt that did not take the lock: at once
// while ctx lasts, so that a caller trying right after does not queue
// behind it, else in the background. It waits for that delete no longer
// than giveUpTimeout: on a server that hangs, go-zookeeper answers only
// when it drops the connection, two thirds of a session timeout after the
// last reply, and the Acquire, whose budget has ended, must not wait that
// long.
//
// Without the session (a connection cut, its budget ended meanwhile), it
// sends nothing: the delete would be queued and go out the moment
// go-zookeeper reconnects, beside its re-setting of watches (see
// awaitSession); cleanup waits for the session. One check only, not
// awaitSession's two: that would add retryPause to every Acquire that
// gives up, and leaves only go-zookeeper's instant between reporting the
// session and reading lastZxid.
func (l *Locker) giveUp(ctx context.Context, a *attempt, node string) {
	if node != "" && ctx.Err() == nil && l.conn.State() == zk.StateHasSession {
		dctx, cancel := context.WithTimeout(ctx, giveUpTimeout)
		defer cancel()
		_, err := bounded(dctx, func() (struct{}, error) { return struct{}{}, l.conn.Delete(node, -1) }, nil)
		if err == nil || errors.Is(err, zk.ErrNoNode) {
			return
		}
	}
	l.cleanup(a, node)
}

// giveUpTimeout bounds giveUp's wait for its delete.
const giveUpTimeout = 500 * time.Millisecond

// why returns ctx's error if ctx is done (the caller's deadline rather than
// the wait budget), else err; err cut short by the end of the wait budget
// (waitCtx) no longer wraps waitCtx's error, which the caller would take
// for its own ctx's; the error of a connection the user closed
// (zk.ErrClosing, or zk.ErrConnectionClosed once it stays disconnected:
// see closed) matches fence.ErrClosed too: it grants no more leases, and
// fence.Lead stops campaigning on it.
func (l *Locker) why(ctx, waitCtx context.Context, err error) error {
	switch {
	case ctx.Err() != nil && !errors.Is(err, fence.ErrHeld):
		return ctx.Err()
	case errors.Is(err, zk.ErrClosing) || errors.Is(err, zk.ErrConnectionClosed) && l.closed():
		return fmt.Errorf("%w (%w)", err, fence.ErrClosed)
	case waitCtx.Err() != nil && errors.Is(err, waitCtx.Err()):
		return fmt.Errorf("%v: no answer from ZooKeeper before the wait budget ended", err)
	}
	return err
}

// create makes the attempt's node and returns its path. It creates the
// lock's directory when missing, and after a connection loss looks for the
// node by its guid before trying again.
func (l *Locker) create(ctx context.Context, a *attempt) (string, error) {
	for {
		node, err := send(ctx, l, func() (string, error) {
			return l.conn.Create(a.nodePrefix(), nil, zk.FlagEphemeralSequential, l.acl)
		}, func(node string, err error) {
			if err == nil {
				l.cleanup(a, node) // created after Acquire gave up
			}
		})
		switch {
		case err == nil:
			return node, nil
		case errors.Is(err, zk.ErrNoNode):
			if err := l.makeDir(ctx, a.dir); err != nil {
				return "", err
			}
		case errors.Is(err, zk.ErrNoServer):
			// Not sent: go-zookeeper found no server in a round of its
			// hosts and is trying again. Sent again once it has the
			// session back (see again), not queued meanwhile.
			if !l.again(ctx, err) {
				return "", fmt.Errorf("zklock: create %s: %w", a.nodePrefix(), err)
			}
		case connLost(err):
			// The create may have been applied: look for it, once the
			// session is back (see again).
			for {
				if !l.again(ctx, err) {
					return "", err
				}
				node, err = l.find(ctx, a)
				if err == nil && node != "" {
					return node, nil
				}
				if err == nil {
					break // not applied: create again
				}
			}
		default:
			return "", fmt.Errorf("zklock: create %s: %w", a.nodePrefix(), err)
		}
	}
}

// find returns the attempt's node if it exists, "" if not. It is called
// when a create's outcome is unknown (its reply lost with the connection,
// or Acquire gave up on it), and lists dir after a sync: the server it is
// connected to, maybe not the one the create went to, has then applied
// every write the leader committed before it. A create sent on the old
// connection was committed before the session moved, or is refused by
// the leader as from a moved session; without the sync, a follower
// behind the leader would answer "not found", and the node, turning up
// later, would be no one's and block the lock for the session's life
// (the create made again, or the clean-up, would miss it).
func (l *Locker) find(ctx context.Context, a *attempt) (string, error) {
	if _, err := send(ctx, l, func() (string, error) { return l.conn.Sync(a.dir) }, nil); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return "", err
	}
	children, err := l.children(ctx, a.dir)
	if errors.Is(err, zk.ErrNoNode) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	for _, c := range children {
		if strings.HasPrefix(c, a.guid+lockInfix) {
			return a.dir + "/" + c, nil
		}
	}
	return "", nil
}

// makeDir creates the root's nodes (persistent) and the lock's directory
// (a container, which the servers delete once it is empty again).
func (l *Locker) makeDir(ctx context.Context, dir string) error {
	parts := strings.Split(strings.TrimPrefix(dir, "/"), "/")
	path := ""
	for i, p := range parts {
		path += "/" + p
		last := i == len(parts)-1
		for {
			_, err := send(ctx, l, func() (string, error) {
				if last {
					return l.conn.CreateContainer(path, nil, zk.FlagContainer, l.acl)
				}
				return l.conn.Create(path, nil, zk.FlagPersistent, l.acl)
			}, nil)
			if err == nil || errors.Is(err, zk.ErrNodeExists) {
				break
			}
			// Sent again after a connection loss: a create that was
			// applied then finds the node there (ErrNodeExists).
			if !l.again(ctx, err) {
				return fmt.Errorf("zklock: create %s: %w", path, err)
			}
		}
	}
	return nil
}

// children lists dir, counting the calls.
func (l *Locker) children(ctx context.Context, dir string) ([]string, error) {
	l.listings.Add(1)
	return send(ctx, l, func() ([]string, error) {
		c, _, err := l.conn.Children(dir)
		return c, err
	}, nil)
}

// sequence returns the sequence number of a lock node's name, or "" if the
// name is not one of a Locker's nodes.
// Only a name a Locker makes counts: a guid (32 lower-case hex digits),
// lockInfix, and the sequence ZooKeeper appends (digits, signed once its
// counter wraps). Another Locker's lock directory can sit in a lock's
// directory when roots nest ("/nest" and "/nest/b": lock "b" of the first
// is the root of the second); escape never makes a name of that shape (see
// looksLikeNode), so such a directory is never taken for a contender.
func sequence(child string) string {
	if !looksLikeNode(child) {
		return ""
	}
	return child[len(newGUID())+len(lockInfix):]
}

// looksLikeNode reports whether child has the shape of a lock node's name.
func looksLikeNode(child string) bool {
	const guidLen = 32
	if len(child) <= guidLen+len(lockInfix) || child[guidLen:guidLen+len(lockInfix)] != lockInfix {
		return false
	}
	for _, c := range []byte(child[:guidLen]) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	seq := strings.TrimPrefix(child[guidLen+len(lockInfix):], "-")
	if seq == "" {
		return false
	}
	for _, c := range []byte(seq) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// queue returns the lock nodes among children in their order of creation.
func queue(children []string) []string {
	var q []string
	for _, c := range children {
		if sequence(c) != "" {
			q = append(q, c)
		}
	}
	slices.SortFunc(q, func(a, b string) int { return strings.Compare(sequence(a), sequence(b)) })
	return q
}

// await waits until node is the lowest in its directory, watching only its
// predecessor, and returns the lease.
func (l *Locker) await(ctx, waitCtx context.Context, a *attempt, node string, o fence.Options, start time.Time) (*lease, error) {
	own := node[strings.LastIndex(node, "/")+1:]
	// held: the lock was seen held. A request that the wait budget's end
	// cut short (the server hung) then returns ErrHeld, as the end of the
	// budget between requests does.
	held := false
	budgetEnded := func() bool { return held && waitCtx.Err() != nil && ctx.Err() == nil }
	for {
		children, err := l.children(waitCtx, a.dir)
		if err != nil {
			if l.again(waitCtx, err) {
				continue
			}
			if budgetEnded() {
				return nil, fence.ErrHeld
			}
			return nil, fmt.Errorf("zklock: list %s: %w", a.dir, err)
		}
		q, err := l.dropDuplicates(waitCtx, a, own, queue(children))
		if err != nil {
			if budgetEnded() {
				return nil, fence.ErrHeld
			}
			return nil, err
		}
		i := slices.Index(q, own)
		switch {
		case i < 0:
			return nil, fmt.Errorf("%w: zklock: %s vanished while waiting (session expired or node deleted)", fence.ErrLeaseLost, node)
		case i == 0:
			ls, err := l.grant(ctx, waitCtx, a, node, o, start)
			if err != nil && budgetEnded() && errors.Is(err, waitCtx.Err()) {
				// The lock came free as the budget ended, and the budget
				// cut the read that would have taken it: not taken
				// within the budget for contention, as for the other
				// backends (the read's error alone, "no answer from
				// ZooKeeper", blamed a server that was answering).
				return nil, fmt.Errorf("%w: the wait budget ended as the lock came free, during its read (%v)", fence.ErrHeld, err)
			}
			return ls, err
		case o.Wait == 0:
			return nil, fence.ErrHeld
		}
		held = true
		pred := a.dir + "/" + q[i-1]
		type watched struct {
			exists bool
			ch     <-chan zk.Event
		}
		// A data watch, not an exists-watch: on a predecessor already gone
		// ExistsW would leave a watch for its creation, which never comes
		// (sequential names are unique), on the server and in go-zookeeper
		// for the session's life. GetW sets none on a missing node.
		w, err := send(waitCtx, l, func() (watched, error) {
			_, _, ch, err := l.conn.GetW(pred)
			if errors.Is(err, zk.ErrNoNode) {
				return watched{}, nil
			}
			return watched{true, ch}, err
		}, nil)
		if err != nil {
			if l.again(waitCtx, err) {
				continue
			}
			if budgetEnded() {
				return nil, fence.ErrHeld
			}
			return nil, fmt.Errorf("zklock: watch %s: %w", pred, err)
		}
		if !w.exists {
			continue
		}
		select {
		case <-w.ch:
		case <-waitCtx.Done():
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fence.ErrHeld
		}
	}
}

// dropDuplicates deletes the nodes of q other than own that carry the
// attempt's guid, and returns q without them. They are this attempt's: a
// create whose reply was lost with the connection, then retried because
// find did not see it (which its sync should rule out: this is the
// defence in depth). No one would hold such a node, and it would block the
// lock for the session's life.
func (l *Locker) dropDuplicates(ctx context.Context, a *attempt, own string, q []string) ([]string, error) {
	mine := a.guid + lockInfix
	kept := q[:0:0]
	for _, c := range q {
		if c == own || !strings.HasPrefix(c, mine) {
			kept = append(kept, c)
			continue
		}
		_, err := send(ctx, l, func() (struct{}, error) { return struct{}{}, l.conn.Delete(a.dir+"/"+c, -1) }, nil)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return nil, fmt.Errorf("zklock: delete duplicate %s/%s: %w", a.dir, c, err)
		}
	}
	return kept, nil
}

// grant watches the node it now holds, reads its creation zxid as the
// token, and starts the lease. Its read, and the reads it sends again after
// a connection loss, last no longer than the wait budget (waitCtx), as
// every other step of an Acquire: on a server that hangs, go-zookeeper
// answers only when it drops the connection, and then reconnects, and the
// caller's ctx may never end. The lease itself lives on ctx's values only.
// A read that the budget's end cut short returns the read's error, not
// ErrHeld: the lock was last seen free of others (why then keeps the
// budget's context error out of it). await says ErrHeld instead when it
// had seen the lock held before this read, as at the budget's end between
// its own requests.
func (l *Locker) grant(ctx, waitCtx context.Context, a *attempt, node string, o fence.Options, start time.Time) (*lease, error) {
	sent := time.Now()
	type watched struct {
		stat *zk.Stat
		ch   <-chan zk.Event
	}
	var w watched
	for {
		var err error
		w, err = send(waitCtx, l, func() (watched, error) {
			_, st, ch, err := l.conn.GetW(node) // no watch left if it is gone
			return watched{st, ch}, err
		}, nil)
		if err == nil {
			break
		}
		if !l.again(waitCtx, err) {
			return nil, fmt.Errorf("zklock: stat %s: %w", node, err)
		}
		sent = time.Now()
	}
	if l.st != nil {
		// The reply came after go-zookeeper logged the grant of the
		// connection it came on: the SessionTimeouts has recorded the
		// node's session, unless it is not the connection's logger (or
		// the session has ended since).
		if _, session := l.st.Timeout(); session != w.stat.EphemeralOwner {
			return nil, l.mismatch(w.stat.EphemeralOwner)
		}
	}
	// The lease's deadline (see deadlineLocked), as known now: a reply
	// past it (a paused server) would give a lease over before anyone
	// used it. The caller gives the node back instead.
	st := l.timeout()
	d := sent.Add(st - st/100 - 2*time.Millisecond)
	if end := sent.Add(o.TTL); o.TTL > 0 && end.Before(d) {
		d = end
	}
	if replied := time.Now(); !replied.Before(d) {
		return nil, fmt.Errorf("zklock: stat %s: %w: %v after the read was sent, past the lease's deadline; given back", node, errLateReply, replied.Sub(sent).Round(time.Millisecond))
	}
	return l.newLease(ctx, a, node, w.stat, w.ch, o.TTL, start, sent), nil
}

// again reports whether a request that failed with err is worth sending
// again: the connection was lost (see connLost), not the session (a
// connection loss is not an expiry), and the user has not closed the
// connection. It waits until the connection has its session again (see
// awaitSession), and reports false once ctx has ended first. Only a
// request whose repetition does no harm may be sent again: a read, or a
// create of a node with a fixed name (a create that was applied then
// finds it there).
func (l *Locker) again(ctx context.Context, err error) bool {
	if !connLost(err) && !errors.Is(err, zk.ErrNoServer) || l.closed() {
		return false
	}
	return l.awaitSession(ctx, 0) == nil
}

// awaitSession waits until a request may be sent on the connection: it
// has its session, seen on two checks retryPause apart (see settled). A
// request sent earlier, queued while go-zookeeper is disconnected, is sent
// the moment it reconnects, beside its re-setting of watches, which reads
// lastZxid while the reply writes it (a data race in go-zookeeper v1.0.4,
// conn.go:614 against conn.go:849). It returns ctx's error if ctx ends
// first, zk.ErrClosing if the user closed the connection, and
// zk.ErrSessionExpired if session is not 0 and the connection's session is
// no longer session.
func (l *Locker) awaitSession(ctx context.Context, session int64) error {
	var s settled
	for !s.check(l.conn) {
		switch {
		case session != 0 && l.conn.SessionID() != session:
			return zk.ErrSessionExpired
		case l.conn.State() == zk.StateDisconnected && l.closed():
			return zk.ErrClosing
		case !l.pause(ctx):
			return ctx.Err()
		}
	}
	return nil
}

// sendable waits, when the connection has not its session now, until it
// has it again (awaitSession), so that no request of the Locker's (an
// Acquire's, Extend's read, Release's delete) is queued while go-zookeeper
// is disconnected and sent beside its re-setting of watches. On a
// connection that has its session it checks once, as giveUp does, and
// adds no pause: what is left is go-zookeeper's instant between reporting
// the session and reading lastZxid. A session of 0 is any session.
func (l *Locker) sendable(ctx context.Context, session int64) error {
	if l.conn.State() == zk.StateHasSession && (session == 0 || l.conn.SessionID() == session) {
		return nil
	}
	return l.awaitSession(ctx, session)
}

// send is bounded for the requests of an Acquire: it sends call once the
// connection has its session (sendable), within ctx. A user's Acquire
// while go-zookeeper reconnects (a leader campaigning again after its
// lease ended with the server paused) queued its create, which went out
// the moment the session came back, beside the re-setting of watches:
// TestLeadServerPausedPastTTL met the lastZxid race there (see
// awaitSession). When ctx ends first, its error says that call was not
// sent for want of a session (no server reachable): not a request that
// went unanswered.
func send[T any](ctx context.Context, l *Locker, call func() (T, error), abandoned func(T, error)) (T, error) {
	if err := l.sendable(ctx, 0); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("not sent, no session on the connection: %w", err)
		}
		var zero T
		return zero, err
	}
	return bounded(ctx, call, abandoned)
}

// settled tells, check by check, whether a request may be sent on a
// connection: it has its session at this check and had it at the one
// before. go-zookeeper reports the session (StateHasSession) before it
// starts re-setting its watches; a check that sees the session after one
// that did not (a reconnection meanwhile) waits for the next, by then
// that is done. The zero settled has seen no check; one made when a
// request was just answered may start with seen true.
type settled struct{ seen bool }

func (s *settled) check(conn *zk.Conn) bool {
	has := conn.State() == zk.StateHasSession
	ok := has && s.seen
	s.seen = has
	return ok
}

// connLost reports whether err is a request's failure on a lost
// connection: zk.ErrConnectionClosed, or the raw error of writing it on a
// connection that was cut (go-zookeeper hands that to the request as is,
// "write tcp ...: use of closed network connection", then drops the
// connection and reconnects). The request may have reached the server,
// as with zk.ErrConnectionClosed.
func connLost(err error) bool {
	var op *net.OpError
	switch {
	case errors.Is(err, zk.ErrConnectionClosed),
		errors.Is(err, net.ErrClosed),
		errors.Is(err, io.EOF),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE),
		errors.As(err, &op) && op.Op == "write":
		return true
	}
	return false
}

// retryPause paces the requests that again sends again.
const retryPause = 50 * time.Millisecond

// cleanup deletes an attempt's node in the background: node if known, else
// any node carrying the attempt's guid (a create whose reply was lost). It
// gives up when the connection is closed, or when the connection's session
// is no longer the one it started with: that session expired and took its
// ephemeral nodes with it. It does not give up after some time without
// reaching ZooKeeper: a server restarted from its data, or a new leader,
// restores the sessions it had with a fresh timeout, and go-zookeeper
// reconnects to the same session however long the outage lasted, with the
// node.
func (l *Locker) cleanup(a *attempt, node string) { l.cleanupThen(a, node, nil) }

// cleanupThen is cleanup, and calls gone (unless nil) if its delete found
// no node: the node was gone before.
func (l *Locker) cleanupThen(a *attempt, node string, gone func()) {
	l.background.Add(1)
	go func() {
		defer l.background.Add(-1)
		session := l.conn.SessionID()
		for {
			// Nothing is sent while disconnected, nor right as the
			// session comes back (see awaitSession).
			if l.awaitSession(context.Background(), session) != nil {
				return
			}
			var err error
			target := node
			if target == "" {
				target, err = l.find(context.Background(), a)
			}
			if err == nil && target != "" {
				err = l.conn.Delete(target, -1)
				if gone != nil && errors.Is(err, zk.ErrNoNode) {
					gone()
				}
			}
			if err == nil || errors.Is(err, zk.ErrNoNode) || l.conn.SessionID() != session || l.closed() {
				return
			}
			time.Sleep(l.timeout() / 8)
		}
	}()
}

// closed reports whether the user closed the connection: go-zookeeper then
// stays disconnected, where a reconnection moves on to connecting at once.
func (l *Locker) closed() bool {
	for range 3 {
		if l.conn.State() != zk.StateDisconnected {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// newGUID names an attempt's node.
func newGUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// escape turns a lock name into one znode name: bytes other than ASCII
// letters, digits and "._:-" become %XX, and so do the dots of "." and ".."
// and the dashes of a name that would read as a lock node's (see
// looksLikeNode), so that a lock directory under a nested root is never
// taken for a contender.
func escape(name string) string {
	e := escapeBytes(name)
	if looksLikeNode(e) {
		return strings.ReplaceAll(e, "-", "%2D")
	}
	return e
}

func escapeBytes(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '_', c == ':', c == '-':
			b.WriteByte(c)
		case c == '.' && name != "." && name != "..":
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// made refuses a Locker that New did not make (a zero Locker, or a nil
// one): it has nothing to lock with, and Acquire panicked on it.
func (l *Locker) made() error {
	if l == nil || l.conn == nil {
		return fmt.Errorf("%w: zklock: a Locker not made by New (zero or nil): use zklock.New", fence.ErrInvalidOption)
	}
	return nil
}
