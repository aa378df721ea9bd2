package zklock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// The servers clamp the session timeout a client asks for to their
// [minSessionTimeout, maxSessionTimeout] (2 and 20 ticks by default), and
// go-zookeeper keeps the one they grant (the negotiated timeout) to itself:
// it only logs it, in its "authenticated" line. A Locker that counted its
// deadlines from the timeout given to New would, when the servers lowered
// it, see its lease held after ZooKeeper expired the session and deleted
// the node (two holders). With WithSessionTimeouts the connection's own
// logger records it (timeouts.go). Without, before its first lease a
// Locker opens one short session of its own to the server its connection
// is on, asking for the same timeout, reads the granted one from that
// line, closes the session, and counts every deadline from the lower of
// the two.

// authenticatedFormat is go-zookeeper v1.0.4's log line once a session is
// established; its arguments are the session id (int64) and the negotiated
// timeout in milliseconds (int32).
const authenticatedFormat = "authenticated: id=%d, timeout=%d"

// probeLimit bounds a probe beyond the caller's ctx: a server that grants
// no session within that long is failing.
func (l *Locker) probeLimit() time.Duration { return max(l.sessionTimeout, 5*time.Second) }

// WithDialer sets the dialer of the Locker's probe, the short session that
// learns the servers' negotiated session timeout before the first lease
// (default net.DialTimeout): give it the one given to zk.Connect with
// zk.WithDialer, if any (TLS, a proxy).
func WithDialer(d zk.Dialer) Option { return func(l *Locker) { l.dialer = d } }

// NegotiatedTimeout returns the session timeout that the servers granted
// for the one given to New, and whether it is known. Leases count their
// deadlines from the lower of the two: a negotiated timeout below the one
// given to New means the servers' maxSessionTimeout is lower than what
// was asked. Without WithSessionTimeouts it is the one granted to the
// Locker's probe, known once the probe has run (at the first Acquire);
// with it, the lowest granted to the connection's current session, as its
// SessionTimeouts recorded it, known from the first grant.
// On a Locker not made by New (nil or zero) nothing is known.
func (l *Locker) NegotiatedTimeout() (time.Duration, bool) {
	if l == nil {
		return 0, false
	}
	if l.st != nil {
		got, session := l.st.Timeout()
		return got, session != 0
	}
	n := l.negotiated.Load()
	return time.Duration(n), n > 0
}

// timeout is the session timeout that deadlines are counted from: the
// lower of the one given to New and the negotiated one. It is only read
// once negotiate (or confirm) has succeeded. A lease uses its own (see
// lease.timeout), which is this one while its session lasts.
func (l *Locker) timeout() time.Duration {
	if l.st != nil {
		if got, session := l.st.Timeout(); session != 0 && got < l.sessionTimeout {
			return got
		}
		return l.sessionTimeout
	}
	if n := time.Duration(l.negotiated.Load()); n > 0 && n < l.sessionTimeout {
		return n
	}
	return l.sessionTimeout
}

// learn returns once the negotiated timeout is known: by the connection's
// SessionTimeouts (confirm) if the Locker has one, else by its probe
// (negotiate).
func (l *Locker) learn(ctx, waitCtx context.Context) error {
	if l.st != nil {
		return l.confirm(waitCtx)
	}
	return l.negotiate(ctx, waitCtx)
}

// negotiate returns once the negotiated timeout is known: at once after
// the first probe that succeeded, else after a probe of its own, or
// another Acquire's that it waits for (one probe at a time). It fails,
// and the Acquire with it, if the probe does not succeed within waitCtx
// (the wait budget, or ctx): no lease is counted from a timeout the
// servers did not confirm. Its probe runs in the background, bounded by
// ctx (and probeLimit), not by the wait budget: one that outlasts the
// budget goes on, and the next Acquire waits for it rather than start
// over, so that Acquires whose budgets are shorter than a probe still
// get a lease.
func (l *Locker) negotiate(ctx, waitCtx context.Context) error {
	for {
		if l.negotiated.Load() > 0 {
			return nil
		}
		l.probeMu.Lock()
		if l.negotiated.Load() > 0 {
			l.probeMu.Unlock()
			return nil
		}
		ch, own := l.probing, false
		var failed *error // the own probe's error, set before ch is closed
		if ch == nil {
			ch, own, failed = make(chan struct{}), true, new(error)
			l.probing = ch
			l.background.Add(1)
			go func() {
				defer l.background.Add(-1)
				got, server, err := l.probe(ctx)
				if err == nil {
					l.negotiated.Store(int64(got))
					l.reportNegotiated(ctx, got, server)
				}
				l.probeMu.Lock()
				*failed = err
				l.probing = nil
				close(ch)
				l.probeMu.Unlock()
			}()
		}
		l.probeMu.Unlock()
		select {
		case <-ch:
		case <-waitCtx.Done():
			if !own || ctx.Err() == nil {
				return fmt.Errorf("zklock: learning the negotiated session timeout: %w", waitCtx.Err())
			}
			<-ch // ctx ended: the probe ends at once, saying what it saw
		}
		if own && *failed != nil {
			return *failed
		}
		// Succeeded, or another Acquire's probe failed on its own ctx.
	}
}

// reportNegotiated logs a negotiated timeout below the one given to New.
func (l *Locker) reportNegotiated(ctx context.Context, got time.Duration, server string) {
	if l.log != nil && got < l.sessionTimeout {
		l.log.LogAttrs(ctx, slog.LevelWarn, "zklock: the servers lowered the session timeout; leases count their deadlines from theirs",
			slog.Duration("asked", l.sessionTimeout), slog.Duration("negotiated", got), slog.String("server", server))
	}
}

// probe opens a session to the server that the Locker's connection has its
// session on (once it has one), asking for the Locker's session timeout,
// and returns the timeout the server granted. The session is closed
// before it returns, unless ctx ends first (a server that hangs once it
// granted it): then it is closed in the background. On ctx's end (or
// probeLimit's, which bounds the probe's session, not the wait for the
// connection's) its connection is cut at once, and go-zookeeper's
// goroutines end within a second.
func (l *Locker) probe(ctx context.Context) (time.Duration, string, error) {
	l.probes.Add(1)
	// The server the connection has its session on: while it reconnects,
	// Server is the one it tries, which may be down. Wait for it as
	// long as ctx lasts, as a create would.
	for l.conn.State() != zk.StateHasSession {
		if l.conn.State() == zk.StateDisconnected && l.closed() {
			return 0, "", fmt.Errorf("zklock: learning the negotiated session timeout: %w", zk.ErrClosing)
		}
		if !l.pause(ctx) {
			return 0, "", fmt.Errorf("zklock: learning the negotiated session timeout: no session on the connection: %w", ctx.Err())
		}
	}
	server := l.conn.Server()
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, l.probeLimit())
	defer cancel()
	// ended is why ctx ended: the caller's ctx's error, or (not one that
	// matches context.DeadlineExceeded, which would say the caller's ctx
	// ended) probeLimit's.
	ended := func() error {
		if err := parent.Err(); err != nil {
			return err
		}
		return fmt.Errorf("no session granted within %v", l.probeLimit())
	}
	d := &probeDialer{dial: l.dialer}
	log := &probeLog{granted: make(chan time.Duration, 1)}
	pc, _, err := zk.Connect([]string{server}, l.sessionTimeout, zk.WithDialer(d.Dial), zk.WithLogger(log), zk.WithLogInfo(true))
	if err != nil {
		return 0, server, fmt.Errorf("zklock: learning the negotiated session timeout from %s: %w", server, err)
	}
	select {
	case got := <-log.granted:
		// The server answers the close at once: it just answered the
		// connect. One that hangs meanwhile would leave Close waiting a
		// second for its answer, past ctx: wait for Close no longer than
		// ctx, then cut its connection and let it end in the background.
		closed := make(chan struct{})
		l.background.Add(1)
		go func() {
			defer l.background.Add(-1)
			pc.Close()
			close(closed)
		}()
		select {
		case <-closed:
		case <-ctx.Done():
			d.cut()
		}
		return got, server, nil
	case <-ctx.Done():
		// A hung server may never answer the connect request, which
		// go-zookeeper waits for ten times its receive timeout: cut the
		// connection and let Close (which waits a second for its own
		// request's answer) end in the background.
		detail := log.lastLine() // before the cut, which go-zookeeper logs
		d.cut()
		l.background.Add(1)
		go func() {
			defer l.background.Add(-1)
			pc.Close()
		}()
		return 0, server, fmt.Errorf("zklock: learning the negotiated session timeout from %s: %w%s", server, ended(), detail)
	}
}

// pause waits retryPause, and reports false if ctx ended first.
func (l *Locker) pause(ctx context.Context) bool {
	t := time.NewTimer(retryPause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// probeLog is the probe's zk.Logger: it keeps the negotiated timeout of
// the "authenticated" line, and the last other line for the probe's error.
type probeLog struct {
	granted chan time.Duration

	mu   sync.Mutex
	last string
}

func (p *probeLog) Printf(format string, args ...any) {
	if format != authenticatedFormat || len(args) != 2 {
		p.mu.Lock()
		p.last = fmt.Sprintf(format, args...)
		p.mu.Unlock()
		return
	}
	if ms, ok := args[1].(int32); ok && ms > 0 {
		select {
		case p.granted <- time.Duration(ms) * time.Millisecond:
		default:
		}
	}
}

// lastLine returns go-zookeeper's last line other than "authenticated",
// as the end of an error message ("" if none).
func (p *probeLog) lastLine() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == "" {
		return ""
	}
	return " (go-zookeeper: " + p.last + ")"
}

// probeDialer dials the probe's connections and can cut them, and refuses
// new ones once cut.
type probeDialer struct {
	dial zk.Dialer // nil: net.DialTimeout

	mu    sync.Mutex
	done  bool
	conns []net.Conn
}

func (d *probeDialer) Dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	dial := d.dial
	if dial == nil {
		dial = net.DialTimeout
	}
	c, err := dial(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		_ = c.Close()
		return nil, errProbeCut
	}
	d.conns = append(d.conns, c)
	return c, nil
}

// errProbeCut is the dial error once the probe gave up.
var errProbeCut = errors.New("zklock: probe given up")

func (d *probeDialer) cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.done = true
	for _, c := range d.conns {
		_ = c.Close()
	}
	d.conns = nil
}
