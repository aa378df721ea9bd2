package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdserver"
	"github.com/fencekit/fence/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestAcquireGiveBackWithinCallersDeadline: an Acquire whose create Txn
// hangs on a paused member (a spare etcd lease kept from the last Release,
// so no Grant goes first) fails at the caller's deadline, and gives its
// etcd lease back: that revoke, on the same hung member, holds the caller
// no more than a short grace (doneGrace, 100 ms) past its deadline (it
// used to be cleanupTimeout, 500 ms: 1.2 s with a 700 ms deadline); it
// goes on in the background until it gets through.
func TestAcquireGiveBackWithinCallersDeadline(t *testing.T) {
	c := etcdtest.Start(t)
	m := c.Members[0]
	l := newLocker(t, c.Endpoints(), nil)
	admin := newClient(t, c.Endpoints(), nil)
	ctx := ctxFor(t, 30*time.Second)
	first, err := l.Acquire(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil { // keeps its etcd lease as a spare
		t.Fatal(err)
	}
	resume := pauseMember(t, m)
	defer resume()
	const deadline, slack = 700 * time.Millisecond, 300 * time.Millisecond
	dctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	_, err = l.Acquire(dctx, t.Name())
	took := time.Since(start)
	t.Logf("Acquire on a paused member: %v after %v", err, took)
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire = %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	if took > deadline+slack {
		t.Errorf("Acquire took %v with a %v deadline", took, deadline)
	}
	// Once the member answers again, nothing holds the name: the etcd
	// lease given back in the background took its key (if the create Txn
	// was applied) with it.
	resume()
	nameFreedOnResume(t, l, admin)
}

// TestFailedReleaseGiveBackWithinCallersDeadline: as
// TestAcquireGiveBackWithinCallersDeadline, for a Release whose delete
// hangs on a paused member: it fails at the caller's deadline and revokes
// the lease's etcd lease, holding the caller no more than doneGrace past
// its deadline (cleanupTimeout before: 1.2 s with a 700 ms deadline); the
// revoke goes on in the background, and once the member answers the key is
// gone and the name free.
func TestFailedReleaseGiveBackWithinCallersDeadline(t *testing.T) {
	c := etcdtest.Start(t)
	m := c.Members[0]
	l := newLocker(t, c.Endpoints(), nil)
	admin := newClient(t, c.Endpoints(), nil)
	ctx := ctxFor(t, 30*time.Second)
	lease, err := l.Acquire(ctx, t.Name(), fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	resume := pauseMember(t, m)
	defer resume()
	const deadline, slack = 700 * time.Millisecond, 300 * time.Millisecond
	dctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	err = lease.Release(dctx)
	took := time.Since(start)
	t.Logf("Release on a paused member: %v after %v", err, took)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Release = %v, want DeadlineExceeded", err)
	}
	if took > deadline+slack {
		t.Errorf("Release took %v with a %v deadline", took, deadline)
	}
	resume()
	nameFreedOnResume(t, l, admin)
}

// pauseMember pauses m and returns resume, which lets it go on (once) and
// waits until it is ready; defer it too.
func pauseMember(t *testing.T, m *etcdserver.Member) (resume func()) {
	m.Stop()
	resumed := false
	return func() {
		if !resumed {
			resumed = true
			m.Cont()
			if err := m.WaitReady(10 * time.Second); err != nil {
				t.Error(err)
			}
		}
	}
}

// nameFreedOnResume checks, once the member answers again, that no key of
// the test's name is left (the etcd lease given back in the background
// took it with it) and that l can take the name.
func nameFreedOnResume(t *testing.T, l *etcdlock.Locker, admin *clientv3.Client) {
	for end := time.Now().Add(10 * time.Second); countKeys(t, admin, l.Prefix(t.Name())) > 0; {
		if time.Now().After(end) {
			t.Fatal("a key of the name is still there 10 s after the member resumed")
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	ctx := ctxFor(t, 30*time.Second)
	again, err := l.Acquire(ctx, t.Name())
	if err != nil {
		t.Fatalf("Acquire after the member resumed = %v", err)
	}
	_ = again.Release(ctx)
}
