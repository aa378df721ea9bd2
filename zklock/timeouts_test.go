package zklock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// exactOpts returns the zk.Logger to give zk.Connect and the options to
// give New: with exact, a SessionTimeouts (quiet beyond it) and
// WithSessionTimeouts; else quiet and none (the probe).
func exactOpts(exact bool) (zk.Logger, []zklock.Option) {
	if !exact {
		return quiet{}, nil
	}
	st := zklock.NewSessionTimeouts(quiet{})
	return st, []zklock.Option{zklock.WithSessionTimeouts(st)}
}

// exactConn connects to addr asking for timeout, with a SessionTimeouts of
// its own (quiet beyond it) as the connection's logger, and opts; the
// connection is closed at the test's end.
func exactConn(t testing.TB, addr string, timeout time.Duration, opts ...func(*zk.Conn)) (*zk.Conn, *zklock.SessionTimeouts) {
	t.Helper()
	st := zklock.NewSessionTimeouts(quiet{})
	conn, _, err := zk.Connect([]string{addr}, timeout, zk.WithLogger(st), func(c *zk.Conn) {
		for _, o := range opts {
			o(c)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn, st
}

// waitLowered waits until l's connection records the grant low (the
// servers lowered the session's timeout), and checks that lease's Deadline
// is then no further away than low: counted from the lowered timeout at
// once, before any request of the Locker's.
func waitLowered(t testing.TB, l *zklock.Locker, lease fence.Lease, low time.Duration) {
	t.Helper()
	waitFor(t, func() bool { got, ok := l.NegotiatedTimeout(); return ok && got == low })
	if left := time.Until(lease.Deadline()); left > low {
		t.Errorf("the lease's Deadline is %v away once the servers granted %v: counted from a higher timeout", left.Round(10*time.Millisecond), low)
	}
}

// With WithSessionTimeouts, a server restarted with a lower
// maxSessionTimeout lowers the lease's Deadline when the connection
// reconnects, and the partitioned holder's lease has ended by the time
// the next holder takes the lock; no probe runs. (The probe's variant,
// TestProbeServerRestartedWithLowerMax, shows two holders.)
func TestSessionTimeoutsServerRestartedWithLowerMax(t *testing.T) {
	testRestartedWithLowerMax(t, true)
}

// With WithSessionTimeouts, a session created on a server with a lower
// maxSessionTimeout than another's, or moved to one, counts its leases'
// Deadlines from the lowest timeout granted to it: no two holders. (The
// probe's variant, TestProbeEnsembleWithDifferentBounds, shows two.)
func TestSessionTimeoutsEnsembleWithDifferentBounds(t *testing.T) {
	t.Run("created on a, moved to c", func(t *testing.T) { testDifferentBounds(t, false, true) })
	t.Run("created on c, moved to a", func(t *testing.T) { testDifferentBounds(t, true, true) })
}

// A Locker given a SessionTimeouts that is not the connection's logger
// (not given to zk.Connect, replaced by a later zk.WithLogger, silenced by
// zk.WithLogInfo(false)) grants no lease: the first Acquire, made before
// the connection has its session, fails with fence.ErrInvalidOption
// naming the fix, within a round trip, not at its ctx's end, and leaves
// no node behind.
func TestSessionTimeoutsNotRecordedFails(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	for _, c := range []struct {
		name    string
		connect func(st *zklock.SessionTimeouts) (*zk.Conn, <-chan zk.Event, error)
	}{
		{"not given to zk.Connect", func(*zklock.SessionTimeouts) (*zk.Conn, <-chan zk.Event, error) {
			return zk.Connect(addrs, sessionTimeout, zk.WithLogger(quiet{}))
		}},
		{"replaced by a later zk.WithLogger", func(st *zklock.SessionTimeouts) (*zk.Conn, <-chan zk.Event, error) {
			return zk.Connect(addrs, sessionTimeout, zk.WithLogger(st), zk.WithLogger(quiet{}))
		}},
		{"silenced by zk.WithLogInfo(false)", func(st *zklock.SessionTimeouts) (*zk.Conn, <-chan zk.Event, error) {
			return zk.Connect(addrs, sessionTimeout, zk.WithLogger(st), zk.WithLogInfo(false))
		}},
		{"silenced by zk.WithLogInfo(false) given before zk.WithLogger", func(st *zklock.SessionTimeouts) (*zk.Conn, <-chan zk.Event, error) {
			return zk.Connect(addrs, sessionTimeout, zk.WithLogInfo(false), zk.WithLogger(st))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := zklock.NewSessionTimeouts(quiet{})
			conn, _, err := c.connect(st)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			l, err := zklock.New(conn, sessionTimeout, zklock.WithSessionTimeouts(st))
			if err != nil {
				t.Fatal(err)
			}
			const limit = 30 * time.Second
			ctx, cancel := context.WithTimeout(context.Background(), limit)
			defer cancel()
			name := "not-recorded-" + strings.ReplaceAll(c.name, " ", "-")
			began := time.Now()
			lease, err := l.Acquire(ctx, name)
			took := time.Since(began)
			if err == nil {
				_ = lease.Release(ctx)
				t.Fatal("Acquire granted a lease with nothing recorded")
			}
			t.Logf("Acquire: %v after %v", err, took.Round(time.Millisecond))
			if !errors.Is(err, fence.ErrInvalidOption) || !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "zk.WithLogger(st)") {
				t.Errorf("Acquire = %v, want fence.ErrNotAcquired and fence.ErrInvalidOption, naming zk.WithLogger(st)", err)
			}
			if took > limit/3 {
				t.Errorf("Acquire failed after %v: it waited for its ctx (%v) rather than fail", took, limit)
			}
			if got, ok := l.NegotiatedTimeout(); ok {
				t.Errorf("NegotiatedTimeout() = %v, true; nothing was recorded", got)
			}
			if n := l.Probes(); n != 0 {
				t.Errorf("%d probes, want none with WithSessionTimeouts", n)
			}
			if ok, _, err := conn.Exists(zklock.DefaultRoot + "/" + zklock.Escape(name)); err != nil || ok {
				t.Errorf("the lock's directory exists: %v, %v; want no node made", ok, err)
			}
		})
	}
}

// New refuses WithSessionTimeouts(nil).
func TestWithSessionTimeoutsNil(t *testing.T) {
	srv := sharedZK(t)
	conn := connect(t, []string{srv.Addr}, nil)
	if _, err := zklock.New(conn, sessionTimeout, zklock.WithSessionTimeouts(nil)); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("New(WithSessionTimeouts(nil)) = %v, want fence.ErrInvalidOption", err)
	}
}

// line is one Printf call.
type line struct {
	format string
	args   []any
}

// recorder is a zk.Logger that keeps its lines.
type recorder struct {
	mu    sync.Mutex
	lines []line
}

func (r *recorder) Printf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, line{format, args})
}

func (r *recorder) has(format string, args ...any) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.lines {
		if l.format == format && fmt.Sprint(l.args...) == fmt.Sprint(args...) {
			return true
		}
	}
	return false
}

// A SessionTimeouts forwards every line, unchanged, to the logger given to
// NewSessionTimeouts (go-zookeeper's default logger, the standard log
// package's, when nil), the "authenticated" line included, and records
// the timeout granted; the first Acquire needs no probe, and the server
// then has only the connection's session.
func TestSessionTimeoutsForwardsAndDoesNotProbe(t *testing.T) {
	srv := startZK(t)
	rec := &recorder{}
	st := zklock.NewSessionTimeouts(rec)
	if got, id := st.Timeout(); got != 0 || id != 0 {
		t.Errorf("Timeout() before any grant = %v, %#x; want 0, 0", got, id)
	}
	conn, _, err := zk.Connect([]string{srv.Addr}, sessionTimeout, zk.WithLogger(st))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	l, err := zklock.New(conn, sessionTimeout, zklock.WithSessionTimeouts(st))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, "forwards") // before the session, perhaps
	if err != nil {
		t.Fatal(err)
	}
	if !rec.has("connected to %s", srv.Addr) {
		t.Errorf("the \"connected to\" line did not reach the next logger: %v", rec.lines)
	}
	if !rec.has("authenticated: id=%d, timeout=%d", conn.SessionID(), int32(sessionTimeout.Milliseconds())) {
		t.Errorf("the \"authenticated\" line did not reach the next logger: %v", rec.lines)
	}
	if got, id := st.Timeout(); got != sessionTimeout || id != conn.SessionID() {
		t.Errorf("Timeout() = %v, %#x; want %v, %#x", got, id, sessionTimeout, conn.SessionID())
	}
	if got, ok := l.NegotiatedTimeout(); !ok || got != sessionTimeout {
		t.Errorf("NegotiatedTimeout() = %v, %v; want %v, true", got, ok, sessionTimeout)
	}
	if n := l.Probes(); n != 0 {
		t.Errorf("%d probes, want none with WithSessionTimeouts", n)
	}
	if n := globalSessions(t, srv); n != "1" {
		t.Errorf("%s sessions on the server after the first Acquire, want 1 (the connection's)", n)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// nil: go-zookeeper's default logger, which writes to the log package.
	var buf syncBuffer
	prev := log.Writer()
	log.SetOutput(&buf)
	defer log.SetOutput(prev)
	st2 := zklock.NewSessionTimeouts(nil)
	conn2, _, err := zk.Connect([]string{srv.Addr}, sessionTimeout, zk.WithLogger(st2))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	waitFor(t, func() bool { _, id := st2.Timeout(); return id != 0 })
	if want := fmt.Sprintf("authenticated: id=%d, timeout=%d", conn2.SessionID(), sessionTimeout.Milliseconds()); !bytes.Contains([]byte(buf.String()), []byte(want)) {
		t.Errorf("the default logger wrote %q, want a line with %q", buf.String(), want)
	}
}

// A SessionTimeouts shared by two connections records the last one's
// grants: the Locker on the other connection, whose node then belongs to
// a session the SessionTimeouts did not last record, grants no lease
// (fence.ErrInvalidOption, naming the fix) and deletes its node.
func TestSessionTimeoutsSharedFails(t *testing.T) {
	srv := sharedZK(t)
	st := zklock.NewSessionTimeouts(quiet{})
	connect := func() *zk.Conn {
		conn, _, err := zk.Connect([]string{srv.Addr}, sessionTimeout, zk.WithLogger(st))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(conn.Close)
		waitFor(t, func() bool { _, id := st.Timeout(); return id != 0 && id == conn.SessionID() })
		return conn
	}
	first := connect()
	connect() // the second: st now records its session
	l, err := zklock.New(first, sessionTimeout, zklock.WithSessionTimeouts(st))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const name = "shared-timeouts"
	lease, err := l.Acquire(ctx, name)
	if err == nil {
		_ = lease.Release(ctx)
		t.Fatal("Acquire granted a lease counted from another connection's session timeout")
	}
	t.Logf("Acquire: %v", err)
	if !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), "give each connection its own") {
		t.Errorf("Acquire = %v, want fence.ErrInvalidOption naming the fix", err)
	}
	// The lock's directory is a container, which the server may have
	// deleted once empty.
	if nodes, _, err := first.Children(zklock.DefaultRoot + "/" + zklock.Escape(name)); err != nil && !errors.Is(err, zk.ErrNoNode) || len(nodes) != 0 {
		t.Errorf("the lock's directory: %v, %v; want no node left", nodes, err)
	}
	waitFor(t, func() bool { return l.Background() == 0 })
}
