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
// hung: its move got no answer and was left to a settle in the background
// that started after Close had returned, which no Close waits for (the
// user closes the client next, and the settle, cut, ends the lease as
// lost). Extend must fail at once with an error matching fence.ErrClosed,
// send nothing and leave the lease as it was.
func TestExtendAfterClose(t *testing.T) {
	l, gate := txnHungLocker(t, nil)
	lease := acquire(t, l, t.Name(), 30*time.Second)
	t.Cleanup(func() { _ = lease.Release(ctxFor(t, 10*time.Second)) })
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
	if !errors.Is(err, fence.ErrClosed) || settling != 0 {
		t.Errorf("Extend after Close = %v, %d settling in the background; want an error matching fence.ErrClosed, nothing started", err, settling)
	}
	if lease.Err() != nil || !lease.Deadline().Equal(before) {
		t.Errorf("lease after an Extend refused: Err %v, Deadline moved by %v", lease.Err(), lease.Deadline().Sub(before))
	}
	gate.resume()
}

// A Release after Locker.Close, of a lease taken before it whose key was
// deleted by hand (a lease of fence.TTL whose watch hears nothing does not
// know), with the member hung: the lease is lost, and the revoke of its
// etcd lease got no answer and was left to be retried in the background,
// after Close had returned: no Close waits for it, and the user's close
// of the client cuts it. After Close nothing is left to the background:
// the revoke is tried within the Release's ctx, as before, and not
// retried after it.
func TestReleaseAfterCloseLeavesNoRetry(t *testing.T) {
	l, g := deafHungLocker(t)
	admin := newClient(t, shared.Endpoints(), nil)
	lease := acquire(t, l, t.Name(), time.Minute)
	if err := l.Close(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err := releaseKeyDeleted(t, admin, g, lease)
	left := etcdlock.GivingBack(l)
	t.Logf("Release after Close, the member hung = %v; %d revokes retried in the background", err, left)
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release of a lease whose key was deleted = %v, want ErrLeaseLost", err)
	}
	if left != 0 {
		t.Errorf("%d revokes retried in the background after Close", left)
	}
}
