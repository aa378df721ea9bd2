package zklock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
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
	l, conn := newLocker(t, addrs)
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
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
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return conn.State() == zk.StateHasSession })
	t.Logf("session %#x back after the restart", conn.SessionID())
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
