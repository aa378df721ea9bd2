package redlock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// TestEvenNodeCounts (held): with 2 or 4 nodes, half of them is not a
// majority (two Lockers split half and half would both hold the name): the
// quorum is n/2+1, an Acquire with half the nodes down fails with
// ErrNoQuorum, and one with fewer down succeeds.
func TestEvenNodeCounts(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(string(rune('0'+n)), func(t *testing.T) {
			srvs := nodes(t, n)
			l := newLocker(t, srvs, nil)
			if l.Quorum() != n/2+1 {
				t.Fatalf("Quorum() = %d with %d nodes, want %d", l.Quorum(), n, n/2+1)
			}
			for i := range n/2 - 1 {
				srvs[i].Kill()
			}
			lease, err := l.Acquire(ctxFor(t), "even", fence.TTL(10*time.Second))
			if err != nil {
				t.Fatalf("Acquire with %d of %d nodes down: %v", n/2-1, n, err)
			}
			if err := lease.Release(ctxFor(t)); err != nil {
				t.Fatalf("Release: %v", err)
			}
			srvs[n/2-1].Kill()
			lease, err = l.Acquire(ctxFor(t), "even", fence.TTL(10*time.Second))
			if err == nil {
				_ = lease.Release(ctxFor(t))
				t.Fatalf("Acquire with %d of %d nodes down (half) granted", n/2, n)
			}
			if !errors.Is(err, redlock.ErrNoQuorum) || !errors.Is(err, fence.ErrNotAcquired) {
				t.Errorf("Acquire with half the nodes down = %v, want ErrNoQuorum and ErrNotAcquired", err)
			}
			if on := lockedOn(t, srvs[n/2:], "even"); len(on) != 0 {
				t.Errorf("failed try left the lock on running nodes %v", on)
			}
		})
	}
}

// TestNodeWithPasswordNotGiven (held): a node that requires a password the
// client was not given (a careless configuration) is one node that
// always errs: the others make a majority, and when they no longer do, the
// error says what the node answered.
func TestNodeWithPasswordNotGiven(t *testing.T) {
	srvs := nodes(t, 3)
	// Set after the start: redistest's readiness check pings without one.
	if err := srvs[2].Client(t).ConfigSet(ctxFor(t), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	cs := clients(t, srvs)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t), "auth", fence.TTL(10*time.Second))
	if err != nil {
		t.Fatalf("Acquire with the third node refusing the client: %v", err)
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	srvs[0].Kill()
	lease, err = l.Acquire(ctxFor(t), "auth", fence.TTL(10*time.Second))
	if err == nil {
		_ = lease.Release(ctxFor(t))
		t.Fatal("Acquire granted with one node down and one refusing the client")
	}
	if !errors.Is(err, redlock.ErrNoQuorum) || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("Acquire = %v, want ErrNoQuorum naming NOAUTH", err)
	}
}
