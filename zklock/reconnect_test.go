package zklock_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// replayed is a zk.Dialer that can refuse new connections (the client cut
// off) and records, for each connection, the opcodes of the requests
// written on it after the handshake, in order.
type replayed struct {
	mu    sync.Mutex
	cut   bool
	heal  bool // the next dial succeeds and heals the cut
	conns []net.Conn
	ops   [][]int32
	hold  *held // see reconnectHeld
}

func (r *replayed) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cut && !r.heal {
		return nil, errors.New("partitioned")
	}
	r.cut, r.heal = false, false
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	r.conns = append(r.conns, c)
	r.ops = append(r.ops, nil)
	rc := &replayedConn{Conn: c, r: r, i: len(r.ops) - 1, held: r.hold}
	r.hold = nil
	return rc, nil
}

// cutOff closes the client's connections and refuses new ones.
func (r *replayed) cutOff() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cut = true
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
}

// healAtNextDial lets the next connection through.
func (r *replayed) healAtNextDial() { r.mu.Lock(); r.heal = true; r.mu.Unlock() }

func (r *replayed) opsOf(i int) []int32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i >= len(r.ops) {
		return nil
	}
	return append([]int32(nil), r.ops[i]...)
}

type replayedConn struct {
	net.Conn
	r     *replayed
	i     int
	shook bool  // the connect request, which has no request header, is written
	held  *held // the first Read waits for its release
}

// held is a reconnection whose handshake is held: the connection is
// dialled, its connect request written, and the reply is read only once
// the test releases it (go-zookeeper is then StateConnected, without its
// session).
type held struct {
	reading chan struct{} // closed when the connect reply is about to be read
	release chan struct{} // closed by the test
}

// reconnectHeld closes the client's connections and holds the next one's
// handshake.
func (r *replayed) reconnectHeld() *held {
	h := &held{reading: make(chan struct{}), release: make(chan struct{})}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hold = h
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
	return h
}

// Read is called by one goroutine at a time: go-zookeeper reads the
// connect reply, then starts its receive loop.
func (rc *replayedConn) Read(p []byte) (int, error) {
	if h := rc.held; h != nil {
		rc.held = nil
		close(h.reading)
		<-h.release
	}
	return rc.Conn.Read(p)
}

func (rc *replayedConn) Write(p []byte) (int, error) {
	rc.r.mu.Lock()
	if !rc.shook {
		rc.shook = true
	} else if len(p) >= 12 {
		rc.r.ops[rc.i] = append(rc.r.ops[rc.i], int32(binary.BigEndian.Uint32(p[8:])))
	}
	rc.r.mu.Unlock()
	return rc.Conn.Write(p)
}

// The delete of an ended lease's node that the Locker makes in the
// background is not sent while disconnected: go-zookeeper would send it
// the moment it reconnects, before its own re-setting of the watches it
// holds (setWatches, opcode 101), whose zxid it reads while the reply's is
// written (a data race in go-zookeeper v1.0.4, which -race reported in the
// hung-server tests). A lease whose lease time runs out while the client
// is cut off leaves a watch on its node behind; once the client is back on
// its session, setWatches is sent before the delete. Before the fix the
// delete, queued while disconnected, went first.
func TestCleanupNotQueuedWhileDisconnected(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	admin := connect(t, addrs, nil)
	var r replayed
	conn := connect(t, addrs, r.dial)
	l, err := zklock.New(conn, sessionTimeout)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const name = "cleanup-disconnected"
	lease, err := l.Acquire(ctx, name, fence.TTL(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r.cutOff()
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease did not end at its deadline")
	}
	// go-zookeeper dials again a second after its last failure, well after
	// the lease ended and its background delete started: the session (2 s)
	// is still alive then.
	r.healAtNextDial()
	waitFor(t, func() bool { return len(lockNodes(t, admin, name)) == 0 })
	ops := r.opsOf(1)
	if len(ops) == 0 {
		t.Fatal("nothing written on a reconnected connection")
	}
	for i, op := range ops {
		if op == 2 {
			t.Fatalf("the reconnected connection wrote a delete before setWatches: opcodes %v", ops)
		}
		if op == 101 {
			break
		}
		if i == len(ops)-1 {
			t.Fatalf("no setWatches on the reconnected connection (the lease's watch was to be set again): opcodes %v", ops)
		}
	}
	if conn.State() != zk.StateHasSession {
		t.Fatalf("state %v after the reconnection", conn.State())
	}
	t.Logf("opcodes on the reconnected connection: %v", ops)
	if err := lease.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of the ended lease = %v, want ErrLeaseLost", err)
	}
}

// An Acquire made while go-zookeeper reconnects waits for the session
// before it sends anything: go-zookeeper would send a queued create the
// moment it has the session back, beside its re-setting of the watches it
// holds (setWatches, opcode 101), whose zxid it reads while the create's
// reply writes it (the race of TestCleanupNotQueuedWhileDisconnected).
// TestLeadServerPausedPastTTL met it in CI: a leader campaigning again
// while the server was paused. Here a lease holds a watch on the
// connection; the connection is cut and the reconnection's handshake held
// while an Acquire starts and parks; once released, setWatches must be
// the first request on the new connection. Before the fix the create went
// first.
func TestAcquireNotQueuedWhileReconnecting(t *testing.T) {
	var r replayed
	l, _, ctx := watchedLocker(t, &r, 1, quiet{})
	h := r.reconnectHeld()
	select {
	case <-h.reading:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconnection within 10 s")
	}
	acquireAcross(t, ctx, l, func() { close(h.release) })
	wantSetWatchesFirst(t, r.opsOf(1))
}

// watchedLocker connects a session of 10 s (long enough for a held
// reconnection: go-zookeeper dials again a second after a cut) to the
// shared server, given as many times as addrs says, through r's dialer,
// with log as go-zookeeper's logger, and returns a Locker on it that holds
// a lease whose node it watches, the connection, and a context of a
// minute.
func watchedLocker(t *testing.T, r *replayed, addrs int, log zk.Logger) (*zklock.Locker, *zk.Conn, context.Context) {
	t.Helper()
	srv := sharedZK(t)
	const long = 10 * time.Second
	conn, _, err := zk.Connect(slices.Repeat([]string{srv.Addr}, addrs), long, zk.WithLogger(log), zk.WithDialer(r.dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	l, err := zklock.New(conn, long)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	watched, err := l.Acquire(ctx, t.Name()+"-watched") // waits for the session; its node is watched
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := watched.Release(ctx); err != nil {
			t.Error(err)
		}
	})
	return l, conn, ctx
}

// acquireAcross starts an Acquire on l while its connection reconnects,
// waits until it parks (waitParked), then calls resume, which lets the
// reconnection go on, and waits for the lease, released in t.Cleanup.
func acquireAcross(t *testing.T, ctx context.Context, l *zklock.Locker, resume func()) {
	t.Helper()
	type result struct {
		lease fence.Lease
		err   error
	}
	done := make(chan result, 1)
	go func() {
		ls, err := l.Acquire(ctx, t.Name()+"-other")
		done <- result{ls, err}
	}()
	waitParked(t, "zklock.(*Locker).acquire(")
	resume()
	var res result
	select {
	case res = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the Acquire did not return within 20 s of the reconnection")
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	t.Cleanup(func() {
		if err := res.lease.Release(ctx); err != nil {
			t.Error(err)
		}
	})
}

// wantSetWatchesFirst fails the test unless the first request of ops (the
// opcodes written on a reconnected connection), pings aside, is
// setWatches (101).
func wantSetWatchesFirst(t *testing.T, ops []int32) {
	t.Helper()
	t.Logf("opcodes on the reconnected connection: %v", ops)
	for _, op := range ops {
		if op == 11 { // ping
			continue
		}
		if op != 101 {
			t.Fatalf("the reconnected connection wrote opcode %d before setWatches: opcodes %v", op, ops)
		}
		return
	}
	t.Fatalf("no setWatches on the reconnected connection (the lease's watch was to be set again): opcodes %v", ops)
}

// waitParked waits until the goroutines running fn (a function name as a
// stack shows it) are all blocked, and the goroutines of bound.Call (a
// request sent for them) too: a request queued in go-zookeeper blocks
// there once queued. It fails the test after 10 s.
func waitParked(t *testing.T, fn string) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		for n := runtime.Stack(buf, true); n == len(buf); n = runtime.Stack(buf, true) {
			buf = make([]byte, 2*len(buf))
		}
		found, busy := false, false
		for _, g := range strings.Split(string(buf), "\n\n") {
			mine := strings.Contains(g, fn)
			if !mine && !strings.Contains(g, "internal/bound.Call") {
				continue
			}
			found = found || mine
			header, _, _ := strings.Cut(g, "\n")
			if strings.Contains(header, "[runnable") || strings.Contains(header, "[running") {
				busy = true
			}
		}
		if found && !busy {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s did not park within 10 s (found: %v)", fn, found)
		}
		runtime.Gosched()
	}
}
