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

// replayed is a zk.Dialer that can refuse new connections (the client cut
// off) and records, for each connection, the opcodes of the requests
// written on it after the handshake, in order.
type replayed struct {
	mu    sync.Mutex
	cut   bool
	heal  bool // the next dial succeeds and heals the cut
	conns []net.Conn
	ops   [][]int32
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
	return &replayedConn{Conn: c, r: r, i: len(r.ops) - 1}, nil
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
	shook bool // the connect request, which has no request header, is written
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
