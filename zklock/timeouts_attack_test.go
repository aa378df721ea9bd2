package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/zkserver"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// swallower is a zk.Dialer whose connections, dialled while it swallows,
// carry the client's bytes to the server but none of the server's back:
// the server processes the connect request, and its reply is lost (a
// connection that breaks, or a network that drops one direction, after
// the server answered).
type swallower struct {
	mu      sync.Mutex
	on      bool
	conns   []net.Conn
	once    sync.Once
	written chan struct{} // closed at the first write on a swallowing connection
}

func newSwallower() *swallower { return &swallower{written: make(chan struct{})} }

func (s *swallower) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.on {
		return c, nil
	}
	s.conns = append(s.conns, c)
	return &swallowed{Conn: c, s: s}, nil
}

// set starts or stops swallowing the replies of new connections; stopping
// closes the connections that swallowed.
func (s *swallower) set(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.on = on
	if !on {
		for _, c := range s.conns {
			_ = c.Close()
		}
		s.conns = nil
	}
}

type swallowed struct {
	net.Conn
	s *swallower
}

func (c *swallowed) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err == nil {
		c.s.once.Do(func() { close(c.s.written) })
	}
	return n, err
}

// Read discards what the server sends, and returns only the connection's
// error (closed, or its read deadline).
func (c *swallowed) Read(b []byte) (int, error) {
	for {
		if _, err := c.Conn.Read(b); err != nil {
			return 0, err
		}
	}
}

// A server restarted with a lower maxSessionTimeout revalidates the
// session, at the connection's connect request, with the timeout it now
// clamps, and expires it by that; if the reply to that request is lost,
// go-zookeeper logs no "authenticated" line (it waits ten receive timeouts
// for the reply, then tries again), the SessionTimeouts records nothing,
// and the lease keeps its Deadline counted from the higher timeout that
// it last saw granted. The session expires by the lower one, and the
// next holder takes the lock while the lease's Deadline is still seconds
// away and its Err nil: two holders.
//
// Failed (2026-12-02, -race): "two holders: the lease's Deadline is still
// 26.3s away, Err nil, when the next holder acquired 2.3s after the
// connect request was sent (3.4s after the last Extend); the
// SessionTimeouts records 30s".
//
// Ending the lease at the "authentication failed" line that follows would
// come too late: go-zookeeper logs it when the server closes the
// connection, at the session's expiry, when the next holder may already
// take the lock. The server may have granted any timeout from its
// minSessionTimeout, which the client does not know.
func TestSessionTimeoutsLostReplyToLoweringReconnect(t *testing.T) {
	t.Skip("bug, documented (package doc, The negotiated session timeout): a connect request that a server restarted with a lower maxSessionTimeout processed, whose reply was lost, lowers the session's timeout on the server without any \"authenticated\" line: the lease's Deadline stays counted from the higher timeout (two holders); the client cannot know the timeout granted (anything from the server's minSessionTimeout), and the safe answers (end every lease at each reconnection dial until its grant is seen, or a user-given floor for the timeout) cost every user leases at each reconnection for an operator's rare change; the doc's rule: lower maxSessionTimeout only with no lease held")
	srv := startZK(t)
	// A long timeout, that the restart, the reconnection and the lowered
	// timeout fit in well before the lease's Deadline.
	const asked = 30 * time.Second
	reconfigure(t, srv, fmt.Sprintf("maxSessionTimeout=%d", asked.Milliseconds()))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sw := newSwallower()
	conn, st := exactConn(t, srv.Addr, asked, zk.WithDialer(sw.dial))
	waitFor(t, func() bool { return conn.State() == zk.StateHasSession })
	l, err := zklock.New(conn, asked, zklock.WithSessionTimeouts(st))
	if err != nil {
		t.Fatal(err)
	}
	const name = "lost-reply-lower"
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	if err := lease.Extend(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	extended := time.Now()
	sw.set(true) // the reconnection's replies are lost
	const lowMax = 4 * zkserver.TickTime
	reconfigure(t, srv, fmt.Sprintf("maxSessionTimeout=%d", lowMax.Milliseconds()))
	select {
	case <-sw.written:
	case <-time.After(20 * time.Second):
		t.Fatal("no connect request sent to the restarted server after 20 s")
	}
	sent := time.Now()
	other, _ := newLocker(t, []string{srv.Addr})
	next, err := other.Acquire(ctx, name, fence.Wait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = next.Release(ctx) }()
	got, _ := st.Timeout()
	if left := time.Until(lease.Deadline()); lease.Err() == nil && left > 0 {
		t.Errorf("two holders: the lease's Deadline is still %v away, Err nil, when the next holder acquired %v after the connect request was sent (%v after the last Extend); the SessionTimeouts records %v",
			left.Round(100*time.Millisecond), time.Since(sent).Round(100*time.Millisecond), time.Since(extended).Round(100*time.Millisecond), got)
	} else {
		t.Logf("next holder acquired %v after the connect request was sent; the lease: Err %v", time.Since(sent).Round(100*time.Millisecond), lease.Err())
	}
	sw.set(false)
	waitFor(t, func() bool { return lease.Err() != nil }) // the session has expired: go-zookeeper hears it at its next connection
	waitFor(t, func() bool { return l.Background() == 0 })
}

// Two Lockers on one connection share its SessionTimeouts: a server
// restarted with a lower maxSessionTimeout lowers both Lockers' leases'
// Deadlines, each lease goes on (Extend works), and neither Locker
// grants the other's lock.
func TestSessionTimeoutsTwoLockersOneConnection(t *testing.T) {
	srv := startZK(t, restartMax)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const asked = restartSession
	bl := &blocker{blocked: map[string]bool{}, conns: map[string][]net.Conn{}}
	conn, st := exactConn(t, srv.Addr, asked, zk.WithDialer(bl.dial))
	var lockers [2]*zklock.Locker
	var leases [2]fence.Lease
	var err error
	for i := range lockers {
		if lockers[i], err = zklock.New(conn, asked, zklock.WithSessionTimeouts(st)); err != nil {
			t.Fatal(err)
		}
	}
	for i, l := range lockers {
		if leases[i], err = l.Acquire(ctx, fmt.Sprintf("two-lockers-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, ls := range leases {
			_ = ls.Release(context.Background())
		}
	}()
	if ls, err := lockers[1].Acquire(ctx, "two-lockers-0"); !errors.Is(err, fence.ErrHeld) {
		if err == nil {
			_ = ls.Release(ctx)
		}
		t.Fatalf("the second Locker's Acquire of the first's lock = %v, want fence.ErrHeld", err)
	}
	const lowMax = 4 * zkserver.TickTime
	restartUnseen(t, srv, bl, fmt.Sprintf("maxSessionTimeout=%d", lowMax.Milliseconds()))
	waitWithin(t, time.Minute, func() bool { return conn.State() == zk.StateHasSession })
	for i, l := range lockers {
		waitLowered(t, l, leases[i], lowMax)
	}
	for i, ls := range leases {
		if err := ls.Extend(ctx, time.Second); err != nil {
			t.Errorf("lease %d: Extend after the restart: %v", i, err)
		}
		if left := time.Until(ls.Deadline()); left > lowMax {
			t.Errorf("lease %d: Deadline %v away after Extend, with %v granted", i, left.Round(10*time.Millisecond), lowMax)
		}
	}
	for i, ls := range leases {
		if err := ls.Release(ctx); err != nil {
			t.Errorf("lease %d: Release: %v", i, err)
		}
	}
	for _, l := range lockers {
		waitFor(t, func() bool { return l.Background() == 0 })
	}
}

// blockingHandler is a slog.Handler that blocks the goroutine that logs
// msg until unblock is closed, after closing blocked.
type blockingHandler struct {
	msg              string
	once             *sync.Once
	blocked, unblock chan struct{}
}

func (h blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h blockingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h blockingHandler) WithGroup(string) slog.Handler            { return h }
func (h blockingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() { close(h.blocked) })
		<-h.unblock
	}
	return nil
}

// A lower grant at a reconnection ends the lease at its new Deadline even
// while the lease's monitor is held in the Locker's Logger (here a handler
// that blocks on the monitor's "check failed" line, made to fail by an
// ACL that refuses reads of the node): the Deadline, Err and Done must
// agree, whatever the user's handler does.
//
// Failed before the fix (2026-12-02, -race): the monitor moved the expiry
// timer, so Done and Err waited for the Deadline counted from the old
// timeout: "Done still open 1s after the lease's Deadline (lowered from
// 19.8s to 2s at the reconnection); Err <nil>".
func TestSessionTimeoutsLoweredWhileLoggerBlocked(t *testing.T) {
	srv := startZK(t, restartMax)
	const asked = restartSession
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bl := &blocker{blocked: map[string]bool{}, conns: map[string][]net.Conn{}}
	conn, st := exactConn(t, srv.Addr, asked, zk.WithDialer(bl.dial))
	h := blockingHandler{msg: "zklock: check of the lease's node failed", once: new(sync.Once),
		blocked: make(chan struct{}), unblock: make(chan struct{})}
	unblock := sync.OnceFunc(func() { close(h.unblock) })
	defer unblock()
	l, err := zklock.New(conn, asked, zklock.WithSessionTimeouts(st), zklock.WithLogger(slog.New(h)))
	if err != nil {
		t.Fatal(err)
	}
	const name = "lowered-logger-blocked"
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	// The node's data changed, which fires the lease's watch, then its
	// reads refused: the monitor's next check (a read, to set the watch
	// again) fails. (ZooKeeper 3.8 does not deliver a data watch's event
	// to a client that may not read the node, hence this order.)
	node := lockNodes(t, conn, name)[0]
	if _, err := conn.Set(node, []byte("changed"), -1); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.SetACL(node, zk.WorldACL(zk.PermWrite|zk.PermAdmin|zk.PermDelete), -1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.blocked:
	case <-time.After(asked):
		t.Fatal("no failed check logged")
	}
	before := lease.Deadline()
	const lowMax = 4 * zkserver.TickTime
	restartUnseen(t, srv, bl, fmt.Sprintf("maxSessionTimeout=%d", lowMax.Milliseconds()))
	waitWithin(t, time.Minute, func() bool { got, _ := st.Timeout(); return got == lowMax })
	after := lease.Deadline()
	if left := time.Until(before); left < 3*time.Second || !after.Before(before) {
		t.Fatalf("the restart took too long to show anything: the old Deadline is %v away, the new one %v", left, time.Until(after))
	}
	select {
	case <-lease.Done():
	case <-time.After(time.Until(after) + time.Second):
		t.Errorf("Done still open 1s after the lease's Deadline (counted from the %v granted at the reconnection; the one counted from the old timeout is %v away); Err %v",
			lowMax, time.Until(before).Round(100*time.Millisecond), lease.Err())
	}
	if err := lease.Err(); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Err after the lowered Deadline = %v, want fence.ErrLeaseLost", err)
	}
	unblock()
	waitFor(t, func() bool { return l.Background() == 0 })
}
