package redlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redlock"
)

// Release with two of three nodes paused, over clients that put the
// context's deadline on the socket: their deletes time out (the node
// timeout) while they sit in the paused nodes' sockets, and Release,
// having deleted on one node only, concludes nothing. The nodes wake and
// run those deletes (this lease's own). A retry then finds the lock gone
// on both: that is no evidence that the lease was lost (it was held until
// the first call, and its own deletes are what removed it), so the retry
// must not report ErrLeaseLost; the lock is released.
func TestReleaseRetryAfterTimedOutDeletes(t *testing.T) {
	srvs := nodes(t, 3)
	const name, ttl = "retry-timed-out", 30 * time.Second
	l := newLocker(t, srvs, &redlock.Options{NodeTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _, _ = closeWithin(l, 10*time.Second) })
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	resume := pause(t, srvs[1:])
	err = lease.Release(ctxFor(t))
	if !errors.Is(err, redlock.ErrNoQuorum) {
		t.Fatalf("Release with 2 of 3 nodes paused = %v, want ErrNoQuorum", err)
	}
	resume()
	waitUnlocked(t, srvs, name, 10*time.Second)
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release retried once the lease's own deletes ran everywhere: %v, want nil", err)
	}
}

// A fixed-TTL lease left to run out (its holder never looked at it again:
// no Done, no Context, no Observer, so no timer ends it) is not held when
// Close is called: Close has nothing of it to release and returns nil, as
// it does for a lease whose end a timer saw. It returned the lease's
// ErrLeaseLost as though a release had failed.
func TestCloseAfterUnwatchedLeaseRanOut(t *testing.T) {
	srvs := nodes(t, 3)
	const name = "close-ran-out"
	l := newLocker(t, srvs, nil)
	watched, err := l.Acquire(ctxFor(t), name+"-watched", fence.TTL(300*time.Millisecond))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	_ = watched.Done() // its expiry timer ends it
	if _, err := l.Acquire(ctxFor(t), name, fence.TTL(300*time.Millisecond)); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	// Both run out on every node (and so past their local deadlines).
	waitUnlocked(t, srvs, name, 10*time.Second)
	waitUnlocked(t, srvs, name+"-watched", 10*time.Second)
	if _, err := closeWithin(l, 5*time.Second); err != nil {
		t.Fatalf("Close after the leases ran out: %v, want nil", err)
	}
}
