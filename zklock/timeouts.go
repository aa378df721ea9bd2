package zklock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fencekit/fence"
	"github.com/go-zookeeper/zk"
)

// SessionTimeouts is a zk.Logger that records the session timeouts the
// servers grant a connection, from go-zookeeper's "authenticated" line,
// which it logs each time the connection (re)establishes its session,
// before any reply on that connection: the exact alternative to the
// Locker's probe (see "The negotiated session timeout" in the package
// doc). It forwards every line to the logger given to NewSessionTimeouts.
//
// Give it to zk.Connect with zk.WithLogger, and to New with
// WithSessionTimeouts:
//
//	st := zklock.NewSessionTimeouts(nil) // or your zk.Logger
//	conn, events, err := zk.Connect(servers, 10*time.Second, zk.WithLogger(st))
//	...
//	locker, err := zklock.New(conn, 10*time.Second, zklock.WithSessionTimeouts(st))
//
// One SessionTimeouts serves one connection: two sharing one would mix
// their sessions' grants. Its zero value forwards to zk.DefaultLogger. It
// records nothing if a later zk.WithLogger replaces it,
// conn.SetLogger does, or zk.WithLogInfo(false) silences the line; a
// Locker then grants no lease (Acquire fails with fence.ErrInvalidOption)
// rather than count its deadlines from a timeout it did not see. It is
// safe for concurrent use.
type SessionTimeouts struct {
	next zk.Logger

	mu        sync.Mutex
	session   int64               // the session of the last "authenticated" line; 0: none yet
	lowest    time.Duration       // the lowest timeout granted to that session
	connected time.Time           // when its last connection was dialled, before its connect request was sent
	dialled   time.Time           // when the last connection was dialled ("connected to" line); zero once used
	changed   chan struct{}       // closed, and replaced, at each "authenticated" line; nil until needed
	leases    map[*lease]struct{} // retimed at each grant (see follow)
}

// NewSessionTimeouts returns a SessionTimeouts that forwards every line to
// next (nil: zk.DefaultLogger, go-zookeeper's own default).
func NewSessionTimeouts(next zk.Logger) *SessionTimeouts {
	if next == nil {
		next = zk.DefaultLogger
	}
	return &SessionTimeouts{next: next}
}

// connectedFormat is go-zookeeper v1.0.4's log line once it has dialled a
// server, before it sends its connect request on that connection; its
// argument is the server's address.
const connectedFormat = "connected to %s"

// Printf records the timeout of an "authenticated" line, and forwards the
// line to the next logger. A nil SessionTimeouts records nothing and
// forwards to zk.DefaultLogger.
func (s *SessionTimeouts) Printf(format string, args ...any) {
	if s == nil {
		zk.DefaultLogger.Printf(format, args...)
		return
	}
	switch format {
	case connectedFormat:
		s.mu.Lock()
		s.dialled = time.Now()
		s.mu.Unlock()
	case authenticatedFormat:
		s.authenticated(args)
	}
	if s.next == nil {
		zk.DefaultLogger.Printf(format, args...)
		return
	}
	s.next.Printf(format, args...)
}

// authenticated records a session's grant. A session keeps the lowest
// timeout it was granted, and only a new session starts over: go-zookeeper
// asks at each reconnection for the timeout last granted, so a server's
// maxSessionTimeout (lower than the last grant) can lower it but only its
// minSessionTimeout raise it, and the deadlines stay counted from the
// lower, earlier bound rather than trust a raise.
func (s *SessionTimeouts) authenticated(args []any) {
	if len(args) != 2 {
		return
	}
	id, ok1 := args[0].(int64)
	ms, ok2 := args[1].(int32)
	if !ok1 || !ok2 || id == 0 || ms <= 0 {
		return
	}
	got := time.Duration(ms) * time.Millisecond
	s.mu.Lock()
	if id != s.session || got < s.lowest {
		s.lowest = got
	}
	if id != s.session {
		s.connected = time.Time{}
	}
	s.session = id
	// The server heard this connection's connect request, sent after it
	// was dialled, and kept the session: it expires it no sooner than the
	// timeout after that.
	if !s.dialled.IsZero() {
		s.connected, s.dialled = s.dialled, time.Time{}
	}
	if s.changed != nil {
		close(s.changed)
	}
	s.changed = make(chan struct{})
	g := grant{s.session, s.connected}
	leases := make([]*lease, 0, len(s.leases))
	for ls := range s.leases {
		leases = append(leases, ls)
	}
	s.mu.Unlock()
	// Here, not on each lease's monitor, which may be held by a Logger's
	// handler: the expiry timers move with the grant (a lease whose
	// session ended, or whose Deadline the lower timeout put in the past,
	// ends on its timer's goroutine, not on go-zookeeper's, which logs
	// this line before it starts serving the connection).
	for _, ls := range leases {
		ls.retime(g)
	}
}

// follow makes every grant retime ls, until forget.
func (s *SessionTimeouts) follow(ls *lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leases == nil {
		s.leases = make(map[*lease]struct{})
	}
	s.leases[ls] = struct{}{}
}

// forget undoes follow.
func (s *SessionTimeouts) forget(ls *lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.leases, ls)
}

// Timeout returns the lowest session timeout that the servers granted the
// connection's current session, and its id; 0, 0 before the first grant,
// and on a nil SessionTimeouts.
func (s *SessionTimeouts) Timeout() (time.Duration, int64) {
	if s == nil {
		return 0, 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lowest, s.session
}

// grant is what a lease needs to know after a (re)connection.
type grant struct {
	session   int64
	connected time.Time // zero: unknown
}

// last returns the last grant, and the channel closed at the next one.
func (s *SessionTimeouts) last() (grant, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return grant{s.session, s.connected}, s.changed
}

// WithSessionTimeouts makes the Locker count its leases' deadlines from the
// session timeouts that st records, the lowest granted to the connection's
// session at every (re)connection, rather than from a probe: st must be
// the connection's zk.Logger (see SessionTimeouts). WithDialer is then not
// used.
func WithSessionTimeouts(st *SessionTimeouts) Option {
	return func(l *Locker) { l.st, l.stSet = st, true }
}

// errNotRecorded is why an Acquire fails when the connection's
// SessionTimeouts recorded nothing, with the fix.
var errNotRecorded = fmt.Errorf("%w: zklock: WithSessionTimeouts: the SessionTimeouts recorded no session timeout "+
	"although the connection answered: give it to zk.Connect with zk.WithLogger(st), after any other zk.WithLogger, "+
	"without zk.WithLogInfo(false), and do not replace it with conn.SetLogger", fence.ErrInvalidOption)

// confirm returns once the connection's SessionTimeouts has recorded a
// grant, at once after the first. Until then it reads "/" (a read the
// server answers from its memory, not through the quorum), sent again
// after a connection loss, within ctx: go-zookeeper logs its
// "authenticated" line before it starts the loops that send and receive
// on that connection, so once a reply has come the line has been logged,
// and a SessionTimeouts that has recorded nothing is not the connection's
// logger (or is silenced). The connection's state would not do:
// go-zookeeper sets StateHasSession before it logs the line.
func (l *Locker) confirm(ctx context.Context) error {
	got, session := l.st.Timeout()
	if session == 0 {
		for {
			_, err := send(ctx, l, func() (struct{}, error) {
				_, _, err := l.conn.Exists("/")
				return struct{}{}, err
			}, nil)
			if err == nil {
				break
			}
			if !l.again(ctx, err) {
				return fmt.Errorf("zklock: confirming the negotiated session timeout: %w", err)
			}
		}
		if got, session = l.st.Timeout(); session == 0 {
			return errNotRecorded
		}
	}
	if !l.reported.Load() && l.reported.CompareAndSwap(false, true) {
		l.reportNegotiated(ctx, got, l.conn.Server())
	}
	return nil
}

// mismatch is why a grant fails when the node taken belongs to another
// session than the one the SessionTimeouts last recorded.
func (l *Locker) mismatch(owner int64) error {
	_, session := l.st.Timeout()
	if l.conn.SessionID() != owner {
		// The node's session has ended: go-zookeeper opens another only
		// once told that one expired.
		return fmt.Errorf("zklock: the session %#x that took the lock has ended (the connection has session %#x)", owner, l.conn.SessionID())
	}
	return fmt.Errorf("%w: zklock: WithSessionTimeouts: the SessionTimeouts last recorded session %#x, but the connection's is %#x: "+
		"it is not this connection's logger (give each connection its own, and do not replace it with conn.SetLogger)",
		fence.ErrInvalidOption, session, owner)
}
