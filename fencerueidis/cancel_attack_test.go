package fencerueidis_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// evalWatch is a rueidis dialer whose connections, once armed, report the
// next write that carries an EVALSHA: as it has gone out, or, holding,
// before it goes out, which it then does only once let is closed.
type evalWatch struct {
	dials atomic.Int32

	mu    sync.Mutex
	armed bool
	hold  bool
	seen  chan struct{}
	let   chan struct{}
}

// arm watches for the next EVALSHA; hold keeps it back until let closes.
func (w *evalWatch) arm(t *testing.T, hold bool) (seen chan struct{}, let func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed, w.hold = true, hold
	w.seen, w.let = make(chan struct{}), make(chan struct{})
	var once sync.Once
	ch := w.let
	let = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(let) // a held write must not outlive the test
	return w.seen, let
}

func (w *evalWatch) dial(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	w.dials.Add(1)
	return &watchConn{Conn: c, w: w}, nil
}

type watchConn struct {
	net.Conn
	w *evalWatch
}

func (c *watchConn) Write(p []byte) (int, error) {
	if !bytes.Contains(bytes.ToUpper(p), []byte("EVALSHA")) {
		return c.Conn.Write(p)
	}
	w := c.w
	w.mu.Lock()
	armed, hold, seen, let := w.armed, w.hold, w.seen, w.let
	w.armed = false
	w.mu.Unlock()
	if !armed {
		return c.Conn.Write(p)
	}
	if hold {
		close(seen)
		<-let
		return c.Conn.Write(p)
	}
	n, err := c.Conn.Write(p)
	close(seen) // written, or failed: the waiter goes on either way
	return n, err
}

// cancelCase is one way to cancel a call after (or as) its script went
// out: the caller's ctx with a deadline or without, on a client that
// pipelines only when calls overlap (a call alone with a deadline is
// written and read on the caller's goroutine, the socket's deadline set
// from ctx's) or always; and the script written to a paused server, or
// held back in the client's write until the call has returned.
type cancelCase struct {
	deadline, pipelining, unsent bool
}

func (c cancelCase) String() string {
	return fmt.Sprintf("deadline=%v/pipelining=%v/unsent=%v", c.deadline, c.pipelining, c.unsent)
}

func cancelCases() []cancelCase {
	var cs []cancelCase
	for _, unsent := range []bool{false, true} {
		for _, deadline := range []bool{false, true} {
			for _, pipelining := range []bool{false, true} {
				cs = append(cs, cancelCase{deadline, pipelining, unsent})
			}
		}
	}
	return cs
}

// cancelledCall arms w, makes the server stop (or the write hold), runs
// call with a ctx that it cancels once the EVALSHA went out (or is on its
// way), and returns call's error once the server runs the script it got.
func cancelledCall(t *testing.T, srv *redistest.Server, w *evalWatch, c cancelCase, call func(context.Context) error) error {
	t.Helper()
	seen, let := w.arm(t, c.unsent)
	resume := let
	if !c.unsent {
		resume = srv.Pause(t)
	}
	cctx, cancel := context.WithCancel(context.Background())
	if c.deadline {
		cctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	}
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(cctx) }()
	select {
	case <-seen:
	case err := <-done:
		t.Fatalf("the call returned (%v) before its script was written", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the script was never written")
	}
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the call did not return within 5 s of its cancellation")
	}
	resume()
	return err
}

// pipes is how many connections the clients of cancelClient pipeline
// on (PipelineMultiplex 1): rueidis sends each command with a key on one
// of them at random, so the give-back may overtake the call it undoes.
const pipes = 2

// cancelClient is a rueidis client of srv through w, and a Locker on it
// that has acquired and released once (its replica record read, the
// scripts loaded), with all its pipelining connections made: rueidis makes
// one when a command first picks it, and one made to a paused server waits
// for the handshake's replies, before the script is written.
func cancelClient(t *testing.T, srv *redistest.Server, w *evalWatch, c cancelCase) *redislock.Locker {
	t.Helper()
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DialCtxFn: w.dial,
		PipelineMultiplex: 1, AlwaysPipelining: c.pipelining})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	wctx := ctx(t)
	for i := 0; w.dials.Load() < pipes; i++ {
		if i == 1000 {
			t.Fatalf("%d connections made after %d commands, want %d", w.dials.Load(), i, pipes)
		}
		if err := rc.Do(wctx, rc.B().Exists().Key(fmt.Sprint("warm:", i)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	l := newLocker(t, rc, redislock.Options{})
	warm, err := l.Acquire(ctx(t), "warm", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestCancelledAcquireGivenBack: as redislock's
// TestCancelledDirectTryGivenBack, on rueidis. An Acquire is cancelled
// (context.Canceled, not a deadline) after its try's script was written to
// a paused server, or while the client's write of it is held back (rueidis
// writes a command queued for a caller that has left). The script runs
// once the server gets it and takes the lock, for an Acquire that returned
// an error: the Locker must give the lock back, not leave it held by
// nobody for its minute-long lease.
func TestCancelledAcquireGivenBack(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	for i, c := range cancelCases() {
		t.Run(c.String(), func(t *testing.T) {
			w := &evalWatch{}
			l := cancelClient(t, srv, w, c)
			name := fmt.Sprintf("lock:cancelled-acquire:%d", i)
			err := cancelledCall(t, srv, w, c, func(ctx context.Context) error {
				lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
				if err == nil {
					t.Errorf("Acquire succeeded (token %d) without the server's answer", lease.Token())
				}
				return err
			})
			t.Logf("Acquire: %v", err)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Acquire = %v, want an error matching context.Canceled", err)
			}
			awaitGone(t, admin, name, 5*time.Second, "the lock of an Acquire cancelled after its script went out")
		})
	}
}

// TestCancelledReleaseFrees: a Release cancelled after its script was
// written to a paused server (or while the write is held back) returns an
// error; the script runs once the server gets it, and the lock must be
// gone then. Release called again does not retry for ever: it finds the
// lock gone (nil, or ErrLeaseLost: the owner-checked script cannot tell a
// lock its own earlier call deleted from one lost).
func TestCancelledReleaseFrees(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	for i, c := range cancelCases() {
		t.Run(c.String(), func(t *testing.T) {
			w := &evalWatch{}
			l := cancelClient(t, srv, w, c)
			name := fmt.Sprintf("lock:cancelled-release:%d", i)
			lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			err = cancelledCall(t, srv, w, c, lease.Release)
			t.Logf("Release: %v", err)
			if err == nil {
				t.Error("Release succeeded without the server's answer")
			}
			awaitGone(t, admin, name, 5*time.Second, "the lock of a Release cancelled after its script went out")
			err = lease.Release(ctx(t))
			t.Logf("Release again: %v", err)
			if err != nil && !errors.Is(err, fence.ErrLeaseLost) {
				t.Errorf("Release again after the first's script ran = %v, want nil or ErrLeaseLost", err)
			}
		})
	}
}
