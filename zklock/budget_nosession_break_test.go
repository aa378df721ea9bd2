package zklock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// An Acquire whose wait budget ends while the connection has no session
// (no server reachable) says so. Its requests wait for the session now,
// and are not sent (see TestAcquireNotQueuedWhileReconnecting); its create
// was sent before, and go-zookeeper failed it with "could not connect to
// a server" at its next round of its hosts. After that change the error
// said only "zklock: create ...: context deadline exceeded: no answer
// from ZooKeeper before the wait budget ended", of a create never sent.
func TestAcquireBudgetEndsWithoutSession(t *testing.T) {
	srv := sharedZK(t)
	var r replayed
	conn := connect(t, []string{srv.Addr}, r.dial)
	l, err := zklock.New(conn, sessionTimeout)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	warm, err := l.Acquire(ctx, "budget-no-session-warm") // the negotiated timeout is known
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r.cutOff()
	waitFor(t, func() bool { return conn.State() != zk.StateHasSession })
	// Longer than go-zookeeper's pause between rounds of its hosts (1 s).
	const budget = 2 * time.Second
	start := time.Now()
	_, err = l.Acquire(ctx, "budget-no-session", fence.Wait(budget))
	took := time.Since(start)
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
	if err == nil {
		t.Fatal("Acquire took the lock with no server reachable")
	}
	if !errors.Is(err, fence.ErrNotAcquired) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v, want ErrNotAcquired, not DeadlineExceeded (the caller's ctx is alive)", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "no session") && !strings.Contains(msg, "could not connect") {
		t.Fatalf("Acquire = %v, want it to say that the connection had no session", err)
	}
	if took > budget+time.Second {
		t.Fatalf("Acquire returned %v after it started, past its wait budget (%v)", took, budget)
	}
}
