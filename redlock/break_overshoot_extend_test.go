package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// TestExtendGiveBackHungWithinDeadline: an Extend whose renewal ran on
// every node in time, but whose replies were read after the lease had
// ended (its deadline passed while they were on their way), gives the
// moved locks back (doc.go: "a renewal whose lease ended while it was on
// its way is given back"). The nodes hang (paused) as those replies come,
// so the give-back hangs. It ran in the Extend's call, on a context of its
// own bounded by the node timeout alone: Extend returned that long past
// its caller's deadline (the project's rule: a server that hangs gets an
// error within the caller's deadline, never a hang).
func TestExtendGiveBackHungWithinDeadline(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "extend-giveback-hung"
	const ttl, margin = 1500 * time.Millisecond, 600 * time.Millisecond
	l, gates := gatedLocker(t, srvs) // node timeout: generous, 2 s
	warmRelease(t, l, srvs, name, ttl)
	lease := warmLease(t, l, name, ttl)
	ended := lease.Done() // arms the expiry timer: the lease ends at its deadline
	for _, g := range gates {
		g.late.Store(true)
	}
	resume := func() {}
	defer func() { resume() }()
	released := make(chan struct{})
	go func() {
		defer close(released)
		for _, g := range gates {
			select {
			case <-g.held:
			case <-time.After(5 * time.Second):
				return
			}
		}
		// Every node moved the lock in time; the replies are read once
		// the lease has ended, and the nodes hang as they are.
		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			return
		}
		resume = pause(t, srvs)
		for _, g := range gates {
			close(g.open)
		}
	}()
	dl := lease.Deadline().Add(300 * time.Millisecond)
	ctx, cancel := context.WithDeadline(ctxFor(t), dl)
	defer cancel()
	err := lease.Extend(ctx, 30*time.Second)
	returned := time.Now()
	<-released
	t.Logf("Extend = %v, %v past its caller's deadline (lease Err %v)", err, returned.Sub(dl).Round(time.Millisecond), lease.Err())
	if err == nil {
		t.Fatal("Extend of a lease that ended while its renewal was on its way returned nil")
	}
	if over := returned.Sub(dl); over > margin {
		t.Errorf("Extend returned %v past its caller's deadline: it waited for the give-back on the hung nodes", over.Round(time.Millisecond))
	}
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Extend = %v, want an error matching fence.ErrLeaseLost (the lease ended at its deadline)", err)
	}
	resume()
	waitUnlocked(t, srvs, name, 10*time.Second)
}
