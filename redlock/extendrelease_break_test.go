package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// The Lease contract: once Release has started, Extend returns an error
// matching fence.ErrLeaseLost (and, here, fence.ErrReleased). Two Extends
// racing a Release returned fence.ErrReleased alone: one that waited its
// turn behind a renewal and found the lease released when it got it, and
// one whose renewal ran on every node before Release's deletes, its replies
// read after Release had ended the lease.
func TestExtendRacingReleaseMatchesLeaseLost(t *testing.T) {
	srvs := nodes(t, 3)
	const ttl = 10 * time.Second
	for _, late := range []bool{false, true} {
		l, gates := gatedLocker(t, srvs)
		name := "extend-racing-release"
		if late {
			name += "-late"
		}
		lease := warmLease(t, l, name, ttl)
		for _, g := range gates {
			if late {
				g.late.Store(true) // the renewal runs, its reply is held
			} else {
				g.hold.Store(true) // the renewal is held on its way
			}
		}
		first := make(chan error, 1)
		go func() { first <- lease.Extend(ctxFor(t), ttl) }()
		for _, g := range gates {
			select {
			case <-g.held:
			case <-time.After(5 * time.Second):
				t.Fatal("the renewal was not sent")
			}
		}
		second := make(chan error, 1)
		go func() { second <- lease.Extend(context.Background(), ttl) }()
		if err := lease.Release(ctxFor(t)); err != nil {
			t.Fatalf("Release: %v", err)
		}
		for _, g := range gates {
			close(g.open)
		}
		for which, ch := range map[string]chan error{"held": first, "waiting": second} {
			if err := <-ch; !errors.Is(err, fence.ErrLeaseLost) || !errors.Is(err, fence.ErrReleased) {
				t.Errorf("late %v: the %s Extend, racing Release = %v, want ErrLeaseLost and ErrReleased", late, which, err)
			}
		}
		waitUnlocked(t, srvs, name, 5*time.Second)
	}
}
