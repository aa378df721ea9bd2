package zklock_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// longSession is the session timeout of the connections of the tests
// below: the servers' maximum (20 ticks), so that go-zookeeper keeps a
// connection to a paused server (it gives one up two thirds of it after
// the last reply) and nothing but the Locker's own clean-up can free the
// lock within seconds of the server resuming.
const longSession = 10 * time.Second

// sentWatch is a zk.Dialer whose connections close sent once they have
// written a packet that match (set by the test) accepts. With sendCut,
// the connection is then closed too, so that the request is in the
// server's socket and its reply lost; with sendDrop, the packet is not
// written: before is called, and the connection closed (the request
// never reaches the server). Each arming matches one packet.
type sentWatch struct {
	mu     sync.Mutex
	match  func([]byte) bool
	how    int
	before func()
	sent   chan struct{}
}

const (
	sendPass = iota
	sendCut
	sendDrop
)

func (w *sentWatch) arm(match func([]byte) bool, how int, before func()) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.match, w.how, w.before, w.sent = match, how, before, make(chan struct{})
	return w.sent
}

func (w *sentWatch) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	conn, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &sentConn{Conn: conn, w: w}, nil
}

type sentConn struct {
	net.Conn
	w *sentWatch
}

func (c *sentConn) Write(p []byte) (int, error) {
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	matched := c.w.match != nil && c.w.match(p)
	if matched && c.w.how == sendDrop {
		close(c.w.sent)
		c.w.match = nil
		c.w.before()
		_ = c.Conn.Close()
		return 0, net.ErrClosed
	}
	n, err := c.Conn.Write(p)
	if matched && err == nil && n == len(p) {
		if c.w.how == sendCut {
			_ = c.Conn.Close()
		}
		close(c.w.sent)
		c.w.match = nil
	}
	return n, err
}

// isOp reports whether a packet (length, xid, opcode) is a request of op
// (1 create, 2 delete).
func isOp(op uint32) func([]byte) bool {
	return func(p []byte) bool { return len(p) >= 12 && binary.BigEndian.Uint32(p[8:]) == op }
}

// longLocker returns a Locker on a connection of longSession through
// dialer (nil: net.DialTimeout), closed in t.Cleanup, once it has a
// session.
func longLocker(t testing.TB, addr string, dialer zk.Dialer) *zklock.Locker {
	t.Helper()
	if dialer == nil {
		dialer = net.DialTimeout
	}
	conn, _, err := zk.Connect([]string{addr}, longSession, zk.WithLogger(quiet{}), zk.WithDialer(dialer))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	waitFor(t, func() bool { return conn.State() == zk.StateHasSession })
	l, err := zklock.New(conn, longSession)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestCancelledCreateOnPausedServerGivenBack: an Acquire whose create went
// out to the server, paused, is cancelled (context.Canceled, no deadline).
// The create sits in the server's socket and is applied when it resumes:
// an ephemeral node of a session that lives on, the lowest, held by
// nobody. Unlike a Redis key or an etcd lease it would not expire: the
// lock would be taken for as long as the Locker's connection lives.
// Another Locker must get the lock within seconds of the server resuming.
// Held (2026-12-02; the four tests below too): the create's late reply,
// and the clean-up's search by guid, queued behind the create, delete it.
// With the background clean-up (Locker.cleanup) disabled, this test, the
// waiter's, the dropped Release's and the cut-off create's fail every run.
func TestCancelledCreateOnPausedServerGivenBack(t *testing.T) {
	testCancelledOnPausedServer(t, pausedCreate)
}

// TestCancelledWaiterOnPausedServerGivenBack: the same for an Acquire
// waiting in line (its node created, behind a holder) cancelled while the
// server is paused: its delete cannot get through then, and its node must
// not stay in line once the server resumes and the holder releases.
func TestCancelledWaiterOnPausedServerGivenBack(t *testing.T) {
	testCancelledOnPausedServer(t, pausedWaiter)
}

// TestCancelledReleaseOnPausedServerFrees: the same for a Release whose
// delete went out to the paused server: cancelled, it fails, and the lock
// must come free once the server resumes (here the delete, read when the
// server resumes, frees it even without the clean-up).
func TestCancelledReleaseOnPausedServerFrees(t *testing.T) {
	testCancelledOnPausedServer(t, pausedRelease)
}

// TestCancelledReleaseDroppedFrees: the same for a Release cancelled as
// its delete is written, which never reaches the paused server (the
// connection is lost instead): the node must go once go-zookeeper has
// reconnected to the resumed server, the session and the node alive. (The
// clean-up's delete, queued behind the write the test holds, is sent as
// go-zookeeper re-sets the lease's watch: the lastZxid race of the package
// doc could show here under -race; it did not in 40 runs.)
func TestCancelledReleaseDroppedFrees(t *testing.T) {
	testCancelledOnPausedServer(t, pausedReleaseDropped)
}

// TestCancelledCreateCutOffGivenBack: an Acquire whose create went out to
// the paused server, the connection then lost (the reply with it), is
// cancelled while go-zookeeper reconnects: when the server resumes, the
// create may be applied from the old connection's socket, and the session
// lives on through the new one. The lock must come free all the same.
func TestCancelledCreateCutOffGivenBack(t *testing.T) {
	testCancelledOnPausedServer(t, pausedCreateCut)
}

const (
	pausedCreate = iota
	pausedWaiter
	pausedRelease
	pausedCreateCut
	pausedReleaseDropped
)

func testCancelledOnPausedServer(t *testing.T, what int) {
	srv := startZK(t)
	ctx, cancelAll := context.WithTimeout(context.Background(), time.Minute)
	defer cancelAll()
	var w sentWatch
	l := longLocker(t, srv.Addr, w.dial)
	other := longLocker(t, srv.Addr, nil)
	name := t.Name()
	// The probe done and the lock's directory made: the next Acquire
	// sends its create at once.
	warm, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var holder fence.Lease
	switch what {
	case pausedWaiter:
		holder, err = other.Acquire(ctx, name)
	case pausedRelease, pausedReleaseDropped:
		holder, err = l.Acquire(ctx, name)
	}
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	paused := true
	defer func() {
		if paused {
			srv.Cont()
		}
	}()
	switch what {
	case pausedWaiter:
		go func() {
			_, err := l.Acquire(cctx, name, fence.Wait(time.Minute))
			done <- err
		}()
		// The holder watches its node, the waiter the holder's.
		waitFor(t, func() bool { return totalWatches(t, srv) == "2" })
		srv.Stop()
	default:
		srv.Stop()
		var sent <-chan struct{}
		returned := make(chan struct{})
		switch what {
		case pausedRelease:
			sent = w.arm(isOp(2), sendPass, nil)
		case pausedReleaseDropped:
			// The write fails once the Release, cancelled, has returned
			// context.Canceled, not the write's error.
			sent = w.arm(isOp(2), sendDrop, func() { cancel(); <-returned })
		case pausedCreateCut:
			sent = w.arm(isLockCreate, sendCut, nil)
		default:
			sent = w.arm(isLockCreate, sendPass, nil)
		}
		go func() {
			if what == pausedRelease || what == pausedReleaseDropped {
				err := holder.Release(cctx)
				close(returned)
				done <- err
				return
			}
			_, err := l.Acquire(cctx, name)
			done <- err
		}()
		select {
		case <-sent:
		case err := <-done:
			select {
			case <-sent: // a dropped write: cancelled as it was written
				done <- err
			default:
				t.Fatalf("returned before its request was sent: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("request never sent")
		}
	}
	cancel()
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("still running 5 s after its ctx was cancelled")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	t.Logf("cancelled: %v", err)
	srv.Cont()
	paused = false
	if what == pausedWaiter {
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	lease, err := other.Acquire(ctx, name, fence.Wait(5*time.Second))
	if err != nil {
		t.Fatalf("the lock was not acquirable %v after the server resumed: %v", time.Since(start), err)
	}
	t.Logf("acquired %v after the server resumed", time.Since(start))
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return l.Background() == 0 })
}
