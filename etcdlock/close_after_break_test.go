package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

// Acquire after Locker.Close took the lock: Close waits for the Locker's
// background work under way, so that the client can be closed after it,
// and a lease granted after it starts such work (its run, its
// give-backs) that no Close waits for. It must fail at once with an error
// matching fence.ErrClosed and fence.ErrNotAcquired (on which fence.Lead
// stops campaigning), whatever its wait budget, and create no key.
func TestAcquireAfterClose(t *testing.T) {
	l := newLocker(t, shared.Endpoints(), nil)
	if err := l.Close(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), t.Name(), fence.Wait(5*time.Second))
	took := time.Since(start)
	if err == nil {
		defer func() { _ = lease.Release(ctxFor(t, 10*time.Second)) }()
	}
	t.Logf("Acquire after Close = %v after %v", err, took.Round(time.Millisecond))
	if !errors.Is(err, fence.ErrClosed) || !errors.Is(err, fence.ErrNotAcquired) || took > time.Second {
		t.Errorf("Acquire after Close = %v after %v, want an error matching fence.ErrClosed and fence.ErrNotAcquired at once", err, took.Round(time.Millisecond))
	}
	if n := countKeys(t, newClient(t, shared.Endpoints(), nil), l.Prefix(t.Name())); n != 0 {
		t.Errorf("%d keys after an Acquire on a closed Locker", n)
	}
}

// Extend after Locker.Close, of a lease taken before it, with the member
// hung: Close released the lease, and Extend returns its Err at once
// (an error matching fence.ErrLeaseLost and fence.ErrReleased), sends
// nothing and leaves the lease as it was. (Before Close released the
// leases held, Extend of one after Close started a settle in the
// background that no Close waited for, the move unanswered, and the
// user's close of the client then cut it; Extend was made to fail with
// fence.ErrClosed instead, as it still does on a lease Close has not yet
// released.)
func TestExtendAfterClose(t *testing.T) {
	l, gate := txnHungLocker(t, nil)
	lease := acquire(t, l, t.Name(), 30*time.Second)
	if err := l.Close(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	before := lease.Deadline()
	gate.hang()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := lease.Extend(ctx, time.Minute)
	settling := etcdlock.Settling(l)
	t.Logf("Extend after Close = %v; %d settling in the background", err, settling)
	if !errors.Is(err, fence.ErrReleased) || !errors.Is(err, fence.ErrLeaseLost) || settling != 0 {
		t.Errorf("Extend after Close = %v, %d settling in the background; want an error matching fence.ErrReleased and fence.ErrLeaseLost, nothing started", err, settling)
	}
	if lease.Err() != fence.ErrReleased || !lease.Deadline().Equal(before) {
		t.Errorf("lease after an Extend refused: Err %v, Deadline moved by %v", lease.Err(), lease.Deadline().Sub(before))
	}
	gate.resume()
}

// Locker.Close of a lease whose key was deleted by hand (a lease of
// fence.TTL whose watch hears nothing does not know), with the member
// hung: Close's Release finds the key gone, and the revoke of the etcd
// lease gets no answer; Close waits for its retries within its ctx and
// says so (a loss is no failure of Close's: it does not report it), and a
// Release after Close returns what Close's did (fence.ErrLeaseLost) at
// once, starting no other retry. Once the member answers, the retry gets
// through. Before Close released the leases held, it returned nil at
// once, leaving the lease held and the key's absence unnoticed.
func TestReleaseAfterCloseOfLostLease(t *testing.T) {
	l, g := deafHungLocker(t)
	admin := newClient(t, shared.Endpoints(), nil)
	lease := acquire(t, l, t.Name(), time.Minute)
	id := leaseID(t, lease)
	if _, err := admin.Delete(ctxFor(t, 10*time.Second), lease.(*etcdlock.Lease).Key()); err != nil {
		t.Fatal(err)
	}
	g.hang() // Txn and LeaseRevoke; the delete (DeleteRange) is answered
	cerr := l.Close(ctxFor(t, 700*time.Millisecond))
	t.Logf("Close, the key deleted and the member hung = %v", cerr)
	if cerr == nil || errors.Is(cerr, fence.ErrLeaseLost) || !errors.Is(cerr, context.DeadlineExceeded) {
		t.Errorf("Close = %v, want its ctx's error for the revoke retried in the background, and no loss", cerr)
	}
	if err := lease.Err(); !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("lease Err after Close = %v, want ErrLeaseLost", err)
	}
	start := time.Now()
	err := lease.Release(ctxFor(t, 5*time.Second))
	took := time.Since(start)
	left := etcdlock.GivingBack(l)
	t.Logf("Release after Close = %v after %v; %d revokes retried in the background", err, took, left)
	if !errors.Is(err, fence.ErrLeaseLost) || took > 100*time.Millisecond {
		t.Errorf("Release after Close = %v after %v, want ErrLeaseLost at once", err, took)
	}
	if left > 1 {
		t.Errorf("%d revokes retried in the background, want Close's alone", left)
	}
	g.resume()
	waitRevoked(t, admin, id, 5*time.Second)
}
