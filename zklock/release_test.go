package zklock_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/zklock"
)

// A Release ends its lease before its delete is sent: once the delete is
// in, the next waiter may take the lock at once, while the releasing call
// still waits for the reply, and the old holder's work under the lease's
// Context must have stopped by then (fence.Lease: Err is nil only while
// the lease is held). The delete is held on its way to the server: the
// lease has ended already (Err, Done, Context), its node is still there,
// and its end is reported once the reply says how: Released, or a loss
// (LostRemoved, Err says so) when the node was deleted meanwhile by
// another client. Before the fix Err was nil and Done open while the
// delete was in flight.
func TestReleaseEndsLeaseBeforeDelete(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	admin := connect(t, addrs, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, removed := range []bool{false, true} {
		var b before
		rec := &observetest.Recorder{}
		l, err := zklock.New(connect(t, addrs, b.dial), sessionTimeout, zklock.WithObserver(rec))
		if err != nil {
			t.Fatal(err)
		}
		name := "release-in-flight"
		if removed {
			name += "-removed"
		}
		lease, err := l.Acquire(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		node := lockNodes(t, admin, name)[0]
		// The delete of the node (opcode 2) waits, before it is written,
		// until the test has looked at the lease.
		sent, resume := holdRequest(&b, 2, node)
		released := make(chan error, 1)
		go func() { released <- lease.Release(ctx) }()
		select {
		case <-sent:
		case err := <-released:
			t.Fatalf("Release = %v before its delete was sent", err)
		case <-time.After(30 * time.Second):
			t.Fatal("no delete sent 30 s after Release")
		}
		// The delete is in flight: the lease has ended, the lock is still
		// held on the server.
		errInFlight := lease.Err()
		var doneInFlight bool
		select {
		case <-lease.Done():
			doneInFlight = true
		default:
		}
		causeInFlight := context.Cause(lease.Context())
		endsInFlight := len(rec.Ends())
		if removed {
			if err := admin.Delete(node, -1); err != nil {
				t.Fatal(err)
			}
		} else if ok, _, err := admin.Exists(node); err != nil || !ok {
			t.Errorf("node %s: exists %v, %v while the delete is held", node, ok, err)
		}
		close(resume)
		relErr := <-released
		b.f.Store(nil)
		if errInFlight != fence.ErrReleased || !doneInFlight || causeInFlight != fence.ErrReleased {
			t.Errorf("removed %v: while the delete was in flight Err() = %v, Done closed %v, Context's cause %v; want ErrReleased, closed, ErrReleased",
				removed, errInFlight, doneInFlight, causeInFlight)
		}
		if endsInFlight != 0 {
			t.Errorf("removed %v: %d ends reported while the delete was in flight, want 0 (reported once the reply says how)", removed, endsInFlight)
		}
		ends := rec.WaitEnds(t, 1, 5*time.Second)
		if removed {
			if !errors.Is(relErr, fence.ErrLeaseLost) || !errors.Is(lease.Err(), fence.ErrLeaseLost) ||
				len(ends) != 1 || ends[0].Cause != fence.LostRemoved || !errors.Is(ends[0].Err, fence.ErrLeaseLost) {
				t.Errorf("node deleted meanwhile: Release = %v, Err() = %v, ends %+v; want ErrLeaseLost, ErrLeaseLost, one LostRemoved", relErr, lease.Err(), ends)
			}
		} else if relErr != nil || lease.Err() != fence.ErrReleased || len(ends) != 1 || ends[0].Cause != fence.Released {
			t.Errorf("Release = %v, Err() = %v, ends %+v; want nil, ErrReleased, one Released", relErr, lease.Err(), ends)
		}
		if err := lease.Release(ctx); (err == nil) != (relErr == nil) {
			t.Errorf("removed %v: Release again = %v, first %v", removed, err, relErr)
		}
		if n := len(rec.Ends()); n != 1 {
			t.Errorf("removed %v: %d ends reported, want 1", removed, n)
		}
		if nodes := lockNodes(t, admin, name); len(nodes) != 0 {
			t.Errorf("removed %v: nodes %v after Release", removed, nodes)
		}
	}
}

// An Extend whose check of the node is in flight when a Release ends the
// lease returns an error matching fence.ErrLeaseLost (the lock is no longer
// this lease's), and fence.ErrReleased, as an Extend after the Release
// does; not nil, and not a bare fence.ErrReleased. The check (an exists,
// opcode 3) is held on its way to the server until the lease has ended.
func TestExtendInFlightWhenReleased(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	admin := connect(t, addrs, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b before
	l, err := zklock.New(connect(t, addrs, b.dial), sessionTimeout)
	if err != nil {
		t.Fatal(err)
	}
	const name = "extend-in-flight"
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	node := lockNodes(t, admin, name)[0]
	sent, resume := holdRequest(&b, 3, node)
	extended := make(chan error, 1)
	go func() { extended <- lease.Extend(ctx, time.Minute) }()
	select {
	case <-sent:
	case <-time.After(30 * time.Second):
		t.Fatal("no exists sent 30 s after Extend")
	}
	released := make(chan error, 1)
	go func() { released <- lease.Release(ctx) }()
	select {
	case <-lease.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("lease not ended 30 s after Release")
	}
	close(resume)
	err = <-extended
	if relErr := <-released; relErr != nil {
		t.Fatalf("Release = %v", relErr)
	}
	b.f.Store(nil)
	if !errors.Is(err, fence.ErrLeaseLost) || !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("Extend in flight as the lease was released = %v, want ErrLeaseLost and ErrReleased", err)
	}
}

// holdRequest holds the first request of opcode op about node on b's
// connection before it is written: sent is closed when it is held, and it
// goes once resume is closed (or 30 s later).
func holdRequest(b *before, op uint32, node string) (sent, resume chan struct{}) {
	sent, resume = make(chan struct{}), make(chan struct{})
	var once sync.Once
	f := func(p []byte) {
		if len(p) < 12 || binary.BigEndian.Uint32(p[8:]) != op || !bytes.Contains(p, []byte(node)) {
			return
		}
		once.Do(func() {
			close(sent)
			select {
			case <-resume:
			case <-time.After(30 * time.Second):
			}
		})
	}
	b.f.Store(&f)
	return sent, resume
}

// A lease whose node another client deleted, unseen yet (the watch's
// event held on its way in), released with a ctx already done: that
// Release sends nothing and leaves the delete to the background, which
// finds no node. Release again must then say the lease was lost (fence.Lease's
// Release: the backend knows the lock was gone before the failed call),
// not nil. With the background delete's finding left unread (goneBefore
// never set), the retry returned nil.
func TestRetriedReleaseAfterUnseenRemove(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	admin := connect(t, addrs, nil)
	var reads heldReads
	l, err := zklock.New(connect(t, addrs, reads.dial), sessionTimeout)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const name = "retried-release-unseen-remove"
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	open := reads.hold()
	if err := admin.Delete(lockNodes(t, admin, name)[0], -1); err != nil {
		open()
		t.Fatal(err)
	}
	done, stop := context.WithCancel(ctx)
	stop()
	first := lease.Release(done)
	open()
	if !errors.Is(first, context.Canceled) {
		t.Fatalf("Release with a done ctx = %v, want context.Canceled", first)
	}
	waitFor(t, func() bool { return l.Background() == 0 })
	if err := lease.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release again, the node gone before the first = %v, want an error matching fence.ErrLeaseLost", err)
	}
}

// heldReads dials connections whose replies and events can be held: while
// held, what a Read took from the server is kept from the client until
// the hold ends.
type heldReads struct {
	gate atomic.Pointer[chan struct{}]
}

func (h *heldReads) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	conn, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &heldConn{Conn: conn, h: h}, nil
}

// hold holds reads until open is called.
func (h *heldReads) hold() (open func()) {
	gate := make(chan struct{})
	h.gate.Store(&gate)
	return sync.OnceFunc(func() { h.gate.Store(nil); close(gate) })
}

type heldConn struct {
	net.Conn
	h *heldReads
}

func (c *heldConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if g := c.h.gate.Load(); g != nil {
		<-*g
	}
	return n, err
}
