package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/zkserver"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// reconfigure kills s, appends lines to its zoo.cfg (a later key wins) and
// starts it again with them.
func reconfigure(t testing.TB, s *zkserver.Server, lines ...string) {
	t.Helper()
	s.Kill()
	f, err := os.OpenFile(filepath.Join(s.Dir, "zoo.cfg"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range lines {
		if _, err := f.WriteString(line + "\n"); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
}

// A server's maxClientCnxns (60 connections per client IP by default)
// counts the probe's connection: a client whose connections fill it (here
// one connection, a limit of one) has a working connection, which took
// locks before the probe was added, but every first Acquire's probe is
// refused (the server closes its connection), and the Locker never grants
// a lease.
//
// Failed (2026-12-02): "Acquire on a connection that works, with the
// server's connection limit reached: fence: lock not acquired:
// "max-cnxns": zklock: learning the negotiated session timeout from
// 127.0.0.1:36215: no session granted within 5s (go-zookeeper:
// authentication failed: EOF) after 5s".
func TestProbeRefusedByMaxClientCnxns(t *testing.T) {
	t.Skip("bug: the probe's extra connection counts against maxClientCnxns; a client at the limit never gets a lease (each first Acquire fails after 5 s), where it did before the probe; no safe fallback without the negotiated timeout, so no small fix")
	srv := startZK(t)
	reconfigure(t, srv, "maxClientCnxns=1")
	l, conn := newLocker(t, []string{srv.Addr})
	if _, _, err := conn.Exists("/"); err != nil {
		t.Fatalf("the connection does not work: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	began := time.Now()
	lease, err := l.Acquire(ctx, "max-cnxns")
	if err != nil {
		t.Errorf("Acquire on a connection that works, with the server's connection limit reached: %v after %v", err, time.Since(began).Round(10*time.Millisecond))
		waitFor(t, func() bool { return l.Background() == 0 })
		return
	}
	_ = lease.Release(ctx)
}

// blocker is a dialer that refuses the addresses it blocks, and closes the
// connections to an address when it blocks it.
type blocker struct {
	mu      sync.Mutex
	blocked map[string]bool
	conns   map[string][]net.Conn
}

func (b *blocker) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.blocked[addr] {
		return nil, errors.New("blocked")
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err == nil {
		b.conns[addr] = append(b.conns[addr], c)
	}
	return c, err
}

// set blocks or unblocks addrs.
func (b *blocker) set(block bool, addrs ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, a := range addrs {
		b.blocked[a] = block
		if block {
			for _, c := range b.conns[a] {
				_ = c.Close()
			}
			b.conns[a] = nil
		}
	}
}

// The probe asks the server the connection is on at the first Acquire. In
// an ensemble whose servers have different bounds (the package doc says to
// configure them alike), the leader may expire the session by another
// server's timeout than the probed one:
//
//   - created on c (maxSessionTimeout 2 s), moved to a (10 s) before the
//     first Acquire: the probe asks a and gets 8 s, the leader expires the
//     session by c's 2 s (failed in each of 3 runs, 2026-12-02: "two
//     holders: the partitioned lease's Deadline is still 5.6s away, Err
//     nil, when the next holder acquired 2.3s into the partition");
//   - created on a, moved to c after it: the probe got a's 8 s, and the
//     leader expires the session by c's 2 s in some runs (2 of 3), by a's
//     8 s in the others ("next holder acquired 8.4s into the partition").
//
// Either way a lease outlives its session: two holders.
func TestProbeEnsembleWithDifferentBounds(t *testing.T) {
	t.Skip("bug: with servers of different maxSessionTimeout, the probed timeout is not the one the leader expires the session by (the package doc's limit, 'configure them alike'); the Locker cannot see the connection's own negotiated timeout (go-zookeeper keeps it unexported) nor the servers it may move to, so no small fix")
	t.Run("created on a, moved to c", func(t *testing.T) { testDifferentBounds(t, false, false) })
	t.Run("created on c, moved to a", func(t *testing.T) { testDifferentBounds(t, true, false) })
}

// testDifferentBounds: the session is created on a (maxSessionTimeout 10 s)
// and moves to c (2 s) after the first Acquire, or (createdOnLow) is
// created on c and moves to a before it. With exact, the Locker takes the
// connection's SessionTimeouts (WithSessionTimeouts) rather than probe.
func testDifferentBounds(t *testing.T, createdOnLow, exact bool) {
	e := startEnsemble(t, 3)
	a, b, c := e.Servers[0], e.Servers[1], e.Servers[2]
	const lowMax = 4 * zkserver.TickTime // 2 s on c; 10 s on the others
	reconfigure(t, c, fmt.Sprintf("maxSessionTimeout=%d", lowMax.Milliseconds()))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if leader, err := e.Leader(e.ElectionLimit()); err == nil {
		t.Logf("leader: server %d (a %d, b %d, c %d)", leader.ID, a.ID, b.ID, c.ID)
	}

	const asked = 16 * zkserver.TickTime // 8 s: below a's maximum, above c's
	first, then := a, c
	if createdOnLow {
		first, then = c, a
	}
	bl := &blocker{blocked: map[string]bool{then.Addr: true, b.Addr: true}, conns: map[string][]net.Conn{}}
	logger, opts := exactOpts(exact)
	conn, _, err := zk.Connect([]string{a.Addr, c.Addr}, asked, zk.WithLogger(logger), zk.WithDialer(bl.dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	waitFor(t, func() bool { return conn.State() == zk.StateHasSession && conn.Server() == first.Addr })
	move := func() {
		bl.set(false, then.Addr)
		bl.set(true, first.Addr)
		waitFor(t, func() bool { return conn.State() == zk.StateHasSession && conn.Server() == then.Addr })
	}
	if createdOnLow {
		move()
	}
	l, err := zklock.New(conn, asked, opts...)
	if err != nil {
		t.Fatal(err)
	}
	const name = "different-bounds"
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	want := asked // the probe asks the server the connection is on
	if exact && createdOnLow {
		want = lowMax // the lowest granted to the session
	}
	if got, ok := l.NegotiatedTimeout(); !ok || got != want {
		t.Fatalf("NegotiatedTimeout() = %v, %v; want %v, true", got, ok, want)
	}
	if !createdOnLow {
		move()
		if exact {
			waitLowered(t, l, lease, lowMax)
		}
	}
	if err := lease.Extend(ctx, time.Second); err != nil {
		t.Fatalf("Extend on %s: %v", conn.Server(), err)
	}
	bl.set(true, a.Addr, c.Addr)
	cutAt := time.Now()

	other, _ := newLocker(t, []string{b.Addr})
	next, err := other.Acquire(ctx, name, fence.Wait(4*asked))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = next.Release(ctx) }()
	noSecondHolder(t, lease, cutAt)
	bl.set(false, a.Addr, c.Addr)
	if n := l.Probes(); exact && n != 0 {
		t.Errorf("%d probes, want none with WithSessionTimeouts", n)
	}
	waitFor(t, func() bool { return l.Background() == 0 })
}

// hangAfter is a net.Conn that runs f once, before returning the read that
// completes the connect response (go-zookeeper reads its length, then its
// body: the second read).
type hangAfter struct {
	net.Conn
	reads int
	f     func()
}

func (h *hangAfter) Read(p []byte) (int, error) {
	n, err := h.Conn.Read(p)
	if h.reads++; h.reads == 2 && h.f != nil {
		h.f()
		h.f = nil
	}
	return n, err
}

// A server that hangs right after it granted the probe its session (paused
// before the client reads the grant) leaves the probe's Close waiting a
// second for its answer (go-zookeeper's Close waits that long): the first
// Acquire must still end with its ctx, as the package doc says of the
// probe ("lasts no longer than the Acquire's ctx and wait budget").
// Before (Close waited for, 2026-12-02): "Acquire returned 1.01s after it
// began, its ctx ended after 300ms".
func TestProbeCloseOnServerHungAfterGrant(t *testing.T) {
	srv := startZK(t)
	var once sync.Once
	dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		h := &hangAfter{Conn: c}
		once.Do(func() { h.f = srv.Stop })
		return h, nil
	}
	l, err := zklock.New(connect(t, []string{srv.Addr}, nil), sessionTimeout, zklock.WithDialer(dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Cont)
	const budget = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	began := time.Now()
	lease, err := l.Acquire(ctx, "hung-after-grant")
	took := time.Since(began)
	if err == nil {
		_ = lease.Release(context.Background())
	}
	t.Logf("Acquire = %v after %v", err, took.Round(10*time.Millisecond))
	if took > budget+budget/2 {
		t.Errorf("Acquire returned %v after it began, its ctx ended after %v", took.Round(10*time.Millisecond), budget)
	}
	srv.Cont()
	waitFor(t, func() bool { return l.Background() == 0 })
}

// A Locker whose Acquires each have a wait budget shorter than the probe
// takes, though long enough for the acquisition itself, gets a lease: the
// probe outlives the budget of the Acquire that started it (not its ctx),
// and the next Acquire waits for it rather than start another. The probe
// costs a dial, a handshake (TLS, for one) and a session created by a
// quorum write; an Acquire on a free lock, a create and two reads on an
// established connection. Here the probe's dial is 300 ms slower (a server
// far away, a TLS handshake), and the Acquires are try-locks with a budget
// of 200 ms, ten times what a local acquisition takes.
// Before (each probe cut with its Acquire's wait budget, 2026-12-02): "no
// lease in 10 try-locks of a free lock (10 probes); the last: fence: lock
// not acquired: "slow-probe": zklock: learning the negotiated session
// timeout from 127.0.0.1:43667: context deadline exceeded: no answer from
// ZooKeeper before the wait budget ended".
func TestProbeSlowerThanEveryBudget(t *testing.T) {
	srv := sharedZK(t)
	const slower = 300 * time.Millisecond
	slowDial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		<-time.After(slower) // the probe's network is slower: not a wait for an event
		return net.DialTimeout(network, addr, timeout)
	}
	l, err := zklock.New(connect(t, []string{srv.Addr}, nil), sessionTimeout, zklock.WithDialer(slowDial))
	if err != nil {
		t.Fatal(err)
	}
	const tries = 10
	var last error
	for range tries {
		lease, err := l.Acquire(context.Background(), "slow-probe", fence.Wait(200*time.Millisecond))
		if err == nil {
			_ = lease.Release(context.Background())
			if n := l.Probes(); n != 1 {
				t.Errorf("%d probes, want 1 (the next Acquire waits for the first)", n)
			}
			waitFor(t, func() bool { return l.Background() == 0 })
			return
		}
		last = err
	}
	t.Errorf("no lease in %d try-locks of a free lock (%d probes); the last: %v", tries, l.Probes(), last)
	waitFor(t, func() bool { return l.Background() == 0 })
}

// An Acquire waiting for another's probe, whose ctx ends meanwhile (its
// probe's dial stuck), probes then itself and gets its lease.
func TestProbeWaiterTakesOverCancelledProbe(t *testing.T) {
	srv := sharedZK(t)
	stuck := make(chan struct{})   // closed when the first dial is stuck
	release := make(chan struct{}) // closed to let it go on
	var dials sync.Mutex
	n := 0
	dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		dials.Lock()
		n++
		first := n == 1
		dials.Unlock()
		if first {
			close(stuck)
			<-release
		}
		return net.DialTimeout(network, addr, timeout)
	}
	l, err := zklock.New(connect(t, []string{srv.Addr}, nil), sessionTimeout, zklock.WithDialer(dial))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		close(release)
		waitFor(t, func() bool { return l.Background() == 0 })
	}()
	ctxA, cancelA := context.WithCancel(context.Background())
	errA := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctxA, "takeover-a")
		errA <- err
	}()
	<-stuck
	ctxB, cancelB := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelB()
	type result struct {
		lease fence.Lease
		err   error
	}
	resB := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctxB, "takeover-b")
		resB <- result{lease, err}
	}()
	cancelA()
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled Acquire = %v, want context.Canceled", err)
	}
	r := <-resB
	if r.err != nil {
		t.Fatalf("the waiting Acquire = %v", r.err)
	}
	if err := r.lease.Release(ctxB); err != nil {
		t.Fatal(err)
	}
	if got := l.Probes(); got != 2 {
		t.Errorf("%d probes, want 2 (the cancelled one, the waiter's)", got)
	}
}

// A Locker whose connection its user closed, before its first Acquire,
// fails at once (zk.ErrClosing, or zk.ErrConnectionClosed when the
// connection still said it had its session, go-zookeeper setting its state
// after Close returns: the probe may then run, on a server that is up), not
// at the end of the Acquire's ctx.
func TestProbeAfterConnClose(t *testing.T) {
	srv := sharedZK(t)
	l, conn := newLocker(t, []string{srv.Addr})
	conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	_, err := l.Acquire(ctx, "after-close")
	took := time.Since(began)
	t.Logf("Acquire after conn.Close = %v after %v", err, took.Round(10*time.Millisecond))
	if !errors.Is(err, zk.ErrClosing) && !errors.Is(err, zk.ErrConnectionClosed) {
		t.Errorf("Acquire after conn.Close = %v, want zk.ErrClosing or zk.ErrConnectionClosed", err)
	}
	if took > 5*time.Second {
		t.Errorf("Acquire after conn.Close took %v", took)
	}
	waitFor(t, func() bool { return l.Background() == 0 })
}

// One probe serves a Locker for its life. A server restarted with a lower
// maxSessionTimeout (a configuration change rolled out) revalidates the
// session when it reconnects with the timeout it now clamps, and expires
// it by that; the Locker still counts its leases' Deadlines from the
// probed one: two holders. Failed in each of 4 runs (2026-12-02): "two
// holders: the partitioned lease's Deadline is still 5.6s away, Err nil,
// when the next holder acquired 2.3s into the partition".
func TestProbeServerRestartedWithLowerMax(t *testing.T) {
	t.Skip("bug: the probe runs once per Locker; a server restarted with a lower maxSessionTimeout shortens the session when it reconnects, and the Locker keeps counting from the probed timeout; seeing it needs the connection's own negotiated timeout (unexported in go-zookeeper v1.0.4) or a probe after each reconnection (not observable without the user's event channel), so no small fix")
	testRestartedWithLowerMax(t, false)
}

// testRestartedWithLowerMax: a lease is taken, the server restarted with a
// lower maxSessionTimeout, and the holder partitioned away. With exact,
// the Locker takes the connection's SessionTimeouts (WithSessionTimeouts)
// rather than probe.
func testRestartedWithLowerMax(t *testing.T, exact bool) {
	srv := startZK(t, restartMax)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const asked = restartSession
	bl := &blocker{blocked: map[string]bool{}, conns: map[string][]net.Conn{}}
	logger, opts := exactOpts(exact)
	conn, _, err := zk.Connect([]string{srv.Addr}, asked, zk.WithLogger(logger), zk.WithDialer(bl.dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	waitFor(t, func() bool { return conn.State() == zk.StateHasSession })
	l, err := zklock.New(conn, asked, opts...)
	if err != nil {
		t.Fatal(err)
	}
	const name = "restarted-lower"
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	const lowMax = 4 * zkserver.TickTime
	// The restarted JVM and go-zookeeper's reconnection: more than 10 s in
	// a loaded CI run, more than 30 s in another (ci36, cause not seen; 4.5
	// s alone here): the session (restartSession) outlasts it, and the
	// connection does not dial the server before it serves.
	restartUnseen(t, srv, bl, fmt.Sprintf("maxSessionTimeout=%d", lowMax.Milliseconds()))
	waitWithin(t, time.Minute, func() bool { return conn.State() == zk.StateHasSession })
	if exact {
		waitLowered(t, l, lease, lowMax)
	}
	if err := lease.Extend(ctx, time.Second); err != nil {
		t.Fatalf("Extend after the restart: %v", err)
	}
	bl.set(true, srv.Addr)
	cutAt := time.Now()
	other, _ := newLocker(t, []string{srv.Addr})
	next, err := other.Acquire(ctx, name, fence.Wait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = next.Release(ctx) }()
	noSecondHolder(t, lease, cutAt)
	bl.set(false, srv.Addr)
	if n := l.Probes(); exact && n != 0 {
		t.Errorf("%d probes, want none with WithSessionTimeouts", n)
	}
	waitFor(t, func() bool { return l.Background() == 0 })
}

// globalSessions returns the server's count of live sessions (mntr).
func globalSessions(t testing.TB, s *zkserver.Server) string {
	t.Helper()
	out, err := s.Command("mntr")
	if err != nil {
		t.Fatalf("mntr: %v", err)
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "zk_global_sessions\t"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no zk_global_sessions in mntr: %q", out)
	return ""
}

// The probe's session is closed by the time the first Acquire returns: the
// server then has only the connection's session.
func TestProbeSessionClosed(t *testing.T) {
	srv := startZK(t)
	l, _ := newLocker(t, []string{srv.Addr})
	oneSessionAfterFirstAcquire(t, srv, l, "probe-closed")
}

// oneSessionAfterFirstAcquire takes name with l's first Acquire and checks
// that the server then has one session, the connection's.
func oneSessionAfterFirstAcquire(t *testing.T, srv *zkserver.Server, l *zklock.Locker, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(ctx) }()
	if n := globalSessions(t, srv); n != "1" {
		t.Errorf("%s sessions on the server after the first Acquire, want 1 (the connection's)", n)
	}
}

// On a server that enforces authentication (enforce.auth.enabled), the
// probe's session, which cannot authenticate (the Locker does not have the
// connection's credentials), is granted, but its close is refused: it
// stays on the server until it expires, a session timeout later, one for
// each Locker. Failed (2026-12-02): "2 sessions on the server after the
// first Acquire, want 1 (the connection's)".
func TestProbeSessionClosedWithEnforcedAuth(t *testing.T) {
	t.Skip("bug: with enforce.auth.enabled the probe's unauthenticated session is granted but its close refused, so it stays until it expires (one per Locker); the probe would need the connection's credentials, which go-zookeeper does not expose, so no small fix")
	srv := startZK(t)
	reconfigure(t, srv, "enforce.auth.enabled=true", "enforce.auth.schemes=digest")
	conn := connect(t, []string{srv.Addr}, nil)
	if err := conn.AddAuth("digest", []byte("user:password")); err != nil {
		t.Fatal(err)
	}
	l, err := zklock.New(conn, sessionTimeout, zklock.WithACL(zk.DigestACL(zk.PermAll, "user", "password")))
	if err != nil {
		t.Fatal(err)
	}
	oneSessionAfterFirstAcquire(t, srv, l, "probe-closed-auth")
}

// Every path that moves a lease's Deadline counts from the negotiated
// timeout when the servers lowered it: Extend (with and without
// fence.TTL, given a TTL longer than either timeout) and the monitor's
// checks.
func TestLoweredTimeoutOnEveryDeadline(t *testing.T) {
	srv := sharedZK(t)
	const asked = 2 * serverMax
	l, err := zklock.New(connectAsking(t, []string{srv.Addr}, asked), asked)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, opts := range [][]fence.Option{nil, {fence.TTL(time.Hour)}} {
		lease, err := l.Acquire(ctx, "lowered-everywhere", opts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Extend(ctx, time.Hour); err != nil {
			t.Fatal(err)
		}
		if left := time.Until(lease.Deadline()); left > serverMax {
			t.Errorf("after Extend (options %v), Deadline %v away, more than the servers' %v", opts, left, serverMax)
		}
		// The monitor checks every third of the timeout: wait for one.
		first := lease.Deadline()
		waitFor(t, func() bool { return lease.Deadline().After(first) })
		if left := time.Until(lease.Deadline()); left > serverMax {
			t.Errorf("after a check (options %v), Deadline %v away, more than the servers' %v", opts, left, serverMax)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Many Lockers starting at once on one connection probe at once, each
// with a connection of its own: above the server's maxClientCnxns (here
// 10, for 20 Lockers) the refused ones try again (go-zookeeper waits a
// second between rounds of its servers) and every Acquire gets its lease.
func TestManyLockersProbeAtOnce(t *testing.T) {
	srv := startZK(t)
	reconfigure(t, srv, "maxClientCnxns=10")
	conn := connect(t, []string{srv.Addr}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 20
	lockers := make([]*zklock.Locker, n)
	for i := range lockers {
		l, err := zklock.New(conn, sessionTimeout)
		if err != nil {
			t.Fatal(err)
		}
		lockers[i] = l
	}
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			lease, err := l.Acquire(ctx, fmt.Sprintf("many-%d", i))
			if err == nil {
				err = lease.Release(ctx)
			}
			errs <- err
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if err != nil {
			failed++
			t.Log(err)
		}
	}
	t.Logf("%d Lockers probing at once, maxClientCnxns 10: %d failed, %v", n, failed, time.Since(began).Round(10*time.Millisecond))
	if failed > 0 {
		t.Errorf("%d of %d first Acquires failed", failed, n)
	}
	for _, l := range lockers {
		waitFor(t, func() bool { return l.Background() == 0 })
	}
}

// closeSignal is a net.Conn that says when it is closed.
type closeSignal struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *closeSignal) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// An Acquire whose ctx ends after the server created the probe's session,
// before the client read the grant, cuts the probe's connection: the
// session, never closed, stays on the server until it expires. Failed
// (2026-12-02, 2 of 2): "2 sessions on the server once the probe ended,
// want 1 (the connection's)".
func TestProbeCutAfterGrantLeavesSession(t *testing.T) {
	t.Skip("bug (minor): a probe cut by its ctx with the grant in flight leaves its session on the server until it expires (a session timeout), as a crashed client would; a fix would let the cut probe wait a little for the grant in the background and close the session, which goes against 'cut at once' (TestProbeOnHungServerEndsByCtx's design), so it is left to the maintainers")
	srv := startZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var once sync.Once
	dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		cs := &closeSignal{Conn: c, closed: make(chan struct{})}
		h := &hangAfter{Conn: cs}
		once.Do(func() {
			h.f = func() {
				cancel() // the grant is read: the session exists
				select {
				case <-cs.closed:
				case <-time.After(10 * time.Second):
				}
			}
		})
		return h, nil
	}
	l, err := zklock.New(connect(t, []string{srv.Addr}, nil), sessionTimeout, zklock.WithDialer(dial))
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(ctx, "cut-after-grant")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire = %v, want context.Canceled", err)
	}
	waitFor(t, func() bool { return l.Background() == 0 })
	if n := globalSessions(t, srv); n != "1" {
		t.Errorf("%s sessions on the server once the probe ended, want 1 (the connection's)", n)
	}
}

// A probe that outlives its Acquire's wait budget while the connection
// has no session (the server down) ends when the user closes the
// connection: nothing is left running.
func TestOutlivingProbeEndsWithConn(t *testing.T) {
	srv := startZK(t)
	l, conn := newLocker(t, []string{srv.Addr})
	srv.Kill()
	waitFor(t, func() bool { return conn.State() != zk.StateHasSession })
	_, err := l.Acquire(context.Background(), "outliving", fence.Wait(300*time.Millisecond))
	if err == nil {
		t.Fatal("Acquire with the server down succeeded")
	}
	t.Logf("Acquire with the server down = %v; %d running in the background", err, l.Background())
	conn.Close()
	waitFor(t, func() bool { return l.Background() == 0 })
	if _, ok := l.NegotiatedTimeout(); ok {
		t.Error("NegotiatedTimeout reports a timeout no server granted")
	}
}

// noSecondHolder fails the test if lease, cut off from ZooKeeper at cutAt,
// still looks held (Err nil, Deadline ahead) now that the next holder has
// acquired its lock, and logs how it ended otherwise.
func noSecondHolder(t *testing.T, lease fence.Lease, cutAt time.Time) {
	t.Helper()
	if left := time.Until(lease.Deadline()); lease.Err() == nil && left > 0 {
		t.Errorf("two holders: the partitioned lease's Deadline is still %v away, Err nil, when the next holder acquired %v into the partition",
			left.Round(100*time.Millisecond), time.Since(cutAt).Round(100*time.Millisecond))
	} else {
		t.Logf("next holder acquired %v into the partition; the lease: Err %v", time.Since(cutAt).Round(100*time.Millisecond), lease.Err())
	}
}
