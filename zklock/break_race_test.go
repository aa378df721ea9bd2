package zklock_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// An Extend racing a Release (a holder's heartbeat goroutine and its
// deferred Release): once Release has returned nil, the lease ended by
// that Release, and Err must say ErrReleased, not that its node was
// deleted by someone else (which the Observer would count as a loss).
func TestExtendRacingReleaseKeepsReleased(t *testing.T) {
	srv := sharedZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, _ := newLocker(t, []string{srv.Addr})
	for round := range 200 {
		lease, err := l.Acquire(ctx, "extend-release", fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		extended := make(chan error, 1)
		go func() {
			for {
				if err := lease.Extend(ctx, time.Minute); err != nil {
					extended <- err
					return
				}
			}
		}()
		for range round % 7 * 1000 {
			runtime.Gosched() // spreads the race over Extend's round trip
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("round %d: Release = %v", round, err)
		}
		eerr := <-extended
		if err := lease.Err(); err != fence.ErrReleased {
			t.Fatalf("round %d: after a Release that returned nil, Err() = %v (Extend = %v), want ErrReleased", round, err, eerr)
		}
		if !errors.Is(eerr, fence.ErrLeaseLost) && !errors.Is(eerr, fence.ErrReleased) {
			t.Fatalf("round %d: Extend after Release = %v", round, eerr)
		}
	}
}

// The Lease contract: Extend returns an error matching fence.ErrLeaseLost
// once the lock is no longer held by the lease, as after its Release
// (memlock, pglock and etcdlock return one matching ErrReleased too).
func TestExtendAfterReleaseMatchesLeaseLost(t *testing.T) {
	srv := sharedZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, _ := newLocker(t, []string{srv.Addr})
	lease, err := l.Acquire(ctx, "extend-after-release")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lease.Extend(ctx, time.Minute); !errors.Is(err, fence.ErrLeaseLost) || !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("Extend after Release = %v, want ErrLeaseLost and ErrReleased", err)
	}
}
