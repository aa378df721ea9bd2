package zklock_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// A server down for longer than the lease's clean-up tries (two session
// timeouts after the lease ended at its deadline), then restarted from its
// data: ZooKeeper restores the sessions it had, each with a fresh timeout,
// and go-zookeeper reconnects to the holder's session, whose node comes
// back with it. The lease ended long ago (ErrLeaseLost at its deadline);
// its node must not hold the lock for nobody for as long as the process
// keeps its connection: the next Acquire must get the lock.
func TestNodeOfEndedLeaseAfterLongOutage(t *testing.T) {
	srv := startZK(t)
	addrs := []string{srv.Addr}
	const name = "long-outage"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Sessions established and expired, counted from go-zookeeper's
	// events: the wait below is for one established after the restart,
	// the holder's or, once that expired, a new one, and says which.
	var sessions, expired atomic.Int64
	conn, _, err := zk.Connect(addrs, sessionTimeout, zk.WithLogger(quiet{}), zk.WithDialer(net.DialTimeout),
		zk.WithEventCallback(func(e zk.Event) {
			switch {
			case e.Type != zk.EventSession:
			case e.State == zk.StateHasSession:
				sessions.Add(1)
			case e.State == zk.StateExpired:
				expired.Add(1)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	waitFor(t, func() bool { return sessions.Load() > 0 })
	l, err := zklock.New(conn, sessionTimeout)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	held := conn.SessionID()
	srv.Kill()
	select {
	case <-lease.Done():
	case <-time.After(3 * sessionTimeout):
		t.Fatal("the lease did not end with the server down")
	}
	if !errors.Is(lease.Err(), fence.ErrLeaseLost) {
		t.Fatalf("Err() = %v, want ErrLeaseLost", lease.Err())
	}
	// The outage outlasts the clean-up's tries.
	<-time.After(2*sessionTimeout + sessionTimeout/2)
	before := sessions.Load()
	restarted := time.Now()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// What the session does: go-zookeeper dials again 1 s after each failed
	// attempt (no growing back-off), and its connect requests are closed
	// unanswered (EOF) until the restarted server serves; then it gets the
	// holder's session back, which ZooKeeper restored from its data with a
	// fresh 2 s timeout. That timeout runs from when the server loaded its
	// data, not from when it serves: under load (the JVM took 6.8 s to
	// serve here) it passes first, the server answers "session has been
	// expired", and go-zookeeper opens a new session 1 s later (2 runs of
	// 13 at a load average of 15; the lease's node went with the old
	// session). The session was back 1.1 to 5.3 s after Restart was called,
	// the new one 8 to 16.5 s after; Restart returns once the server
	// answers. Each attempt may wait 10 receive timeouts (13.3 s) for the
	// answer to its connect request: the 10 s of waitFor, after which this
	// test failed under load, is less than one; 30 s covers two.
	end := time.Now().Add(30 * time.Second)
	for sessions.Load() == before {
		if time.Now().After(end) {
			t.Fatalf("no session 30 s after the restart: state %v", conn.State())
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	if id := conn.SessionID(); id == held && expired.Load() == 0 {
		t.Logf("session %#x back %v after the restart", id, time.Since(restarted).Round(time.Millisecond))
	} else {
		// The node went with the expired session: the Acquire below
		// shows less (nothing for the lease's clean-up to delete).
		t.Logf("session %#x expired; new session %#x %v after the restart", held, id, time.Since(restarted).Round(time.Millisecond))
	}
	other, _ := newLocker(t, addrs)
	next, err := other.Acquire(ctx, name, fence.Wait(4*sessionTimeout))
	if err != nil {
		nodes, _, _ := conn.Children("/fence/locks/" + name)
		t.Fatalf("Acquire after the outage = %v: the ended lease's node %v still holds the lock", err, nodes)
	}
	if next.Token() <= lease.Token() {
		t.Fatalf("token %#x after %#x", next.Token(), lease.Token())
	}
	_ = next.Release(ctx)
}
