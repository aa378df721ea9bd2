package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// extendPastDeadline renews a lease with two nodes of three hung, under a
// ctx that ends just after the lease's deadline, so that the renewal
// reaches too few nodes and is read once the lease has ended. It returns
// the lease, how long after ctx's deadline Extend returned, and Extend's
// error.
func extendPastDeadline(t *testing.T, name string) (fence.Lease, time.Duration, error) {
	srvs := nodes(t, 3)
	const ttl, nodeTimeout = 3 * time.Second, 5 * time.Second
	l := newLocker(t, srvs, &redlock.Options{NodeTimeout: nodeTimeout})
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := lease.Extend(ctxFor(t), ttl); err != nil { // loads the extend script
		t.Fatalf("Extend: %v", err)
	}
	resume1, resume2 := srvs[1].Pause(t), srvs[2].Pause(t)
	ctx, cancel := context.WithDeadline(context.Background(), lease.Deadline().Add(100*time.Millisecond))
	defer cancel()
	err = lease.Extend(ctx, 10*time.Second) // its node timeout, 5 s, outlasts ctx
	late := time.Since(deadlineOf(ctx))
	resume1()
	resume2()
	waitUnlocked(t, srvs, name, 5*time.Second)
	if err := l.Close(ctxFor(t)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return lease, late, err
}

// An Extend whose renewal was read after the lease's deadline returns the
// lease's end (ErrLeaseLost), the contract's answer, not ErrNoQuorum alone,
// a backend error to retry.
func TestExtendLeaseEndedWhileRenewalOut(t *testing.T) {
	lease, late, err := extendPastDeadline(t, "extend-ended")
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Extend with 2 of 3 nodes hung, read past the deadline = %v (%v late), want ErrLeaseLost", err, late)
	}
	if lease.Err() == nil {
		t.Errorf("the lease is held past its deadline: Extend = %v, Deadline in %v", err, time.Until(lease.Deadline()))
	}
}

// The same Extend gives back the nodes it may have moved the lock on (a
// node that answered, and the hung ones, whose renewal may have run), and
// returns by its ctx's deadline, not the node timeout's: it returned 3 s
// past it when it waited for that give-back. The give-back is background
// work that Close waits for (1b9f4eb): a Close whose ctx is short reports
// it (*CloseError) rather than leave a lock moved a whole extension ahead
// unsaid (TestStressAcquireRenewCloseLeavesNothing,
// TestExtendBackgroundGiveBackCloseWaits).
func TestExtendPastDeadlineKeepsItsContext(t *testing.T) {
	if _, late, err := extendPastDeadline(t, "extend-ctx"); late > 500*time.Millisecond {
		t.Errorf("Extend returned %v after its context's deadline (node timeout 5s): %v", late.Round(time.Millisecond), err)
	}
}
