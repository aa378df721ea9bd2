package zklock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/zkserver"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// TestSessionTimeoutAboveServerMax: a session timeout that the servers
// lower (above maxSessionTimeout, 20 ticks: 10 s here) is accepted by
// zk.Connect and by New, which cannot see the negotiated one (go-zookeeper
// does not export it). If the lease's Deadline is counted from the timeout
// given, 20 s, ZooKeeper expires the session, and deletes the holder's
// node, after 10 s: a partitioned holder still sees its lease held, its
// Deadline seconds away, when the next holder has taken the lock. The
// Locker's probe learns the 10 s at the first Acquire, and the Deadline is
// counted from it.
// Before (zklock.New trusted the timeout, 2026-12-02): "two holders: the
// partitioned lease's Deadline is still 9.7s away, Err nil, when the next
// holder acquired 10.1s into the partition".
func TestSessionTimeoutAboveServerMax(t *testing.T) {
	srv := sharedZK(t)
	addrs := []string{srv.Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const asked = 40 * zkserver.TickTime // twice the servers' maximum
	var p partition
	conn, _, err := zk.Connect(addrs, asked, zk.WithLogger(quiet{}), zk.WithDialer(p.dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	waitFor(t, func() bool { return conn.State() == zk.StateHasSession })
	l, err := zklock.New(conn, asked)
	if err != nil {
		t.Logf("New with a session timeout of %v: %v", asked, err)
		return // refused: no trap
	}
	const name = "session-above-max"
	lease, err := l.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	p.set(true)
	cutAt := time.Now()

	other, _ := newLocker(t, addrs)
	next, err := other.Acquire(ctx, name, fence.Wait(2*asked))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = next.Release(ctx) }()
	noSecondHolder(t, lease, cutAt)
	if got, ok := l.NegotiatedTimeout(); !ok || got != serverMax {
		t.Errorf("NegotiatedTimeout() = %v, %v; want %v, true", got, ok, serverMax)
	}
	// Heal, so that the background delete of the lost lease's node ends
	// (it finds the session gone) before goleak looks.
	p.set(false)
	waitFor(t, func() bool { return l.Background() == 0 })
}

// serverMax is the servers' maxSessionTimeout (20 ticks, the default).
const serverMax = 20 * zkserver.TickTime
