package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/observetest"
)

// stillHeld fails the test if lease ends, or its key leaves etcd, within
// d: a revoke retried in the background of an etcd lease that holds its
// key would delete it.
func stillHeld(t *testing.T, l *etcdlock.Locker, lease fence.Lease, d time.Duration) {
	t.Helper()
	admin := newClient(t, shared.Endpoints(), nil)
	for end := time.Now().Add(d); time.Now().Before(end); {
		if err := lease.Err(); err != nil {
			t.Fatalf("lease %d ended: %v", lease.Token(), err)
		}
		keyOn(t, admin, lease)
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
}

// A Release that waits for a background settle (the member answers
// again; the settle puts the key back on its etcd lease and revokes the
// new one) keeps the etcd lease for reuse, and the Locker's next Acquire
// takes it: no revoke of it, retried in the background since the Extend
// (of the old one, of the new one, of the lease's), deletes the new
// holder's key. The revokes the Extend left behind are let through
// first: they are what would hit it.
func TestSpareAfterBackgroundSettleReused(t *testing.T) {
	l, _, gate := hungLocker(t, nil)
	lease := acquire(t, l, t.Name(), time.Minute)
	first := leaseID(t, lease)
	hangExtend(t, gate, lease)
	released := make(chan error, 1)
	go func() { released <- lease.Release(ctxFor(t, 10*time.Second)) }()
	gate.resume()
	if err := <-released; err != nil {
		t.Fatalf("Release once the member answers = %v", err)
	}
	waitSettled(t, l, 5*time.Second)
	next := acquire(t, l, t.Name(), time.Minute)
	defer next.Release(context.Background())
	if id := leaseID(t, next); id != first {
		t.Logf("next Acquire on etcd lease %x, not the spare %x (too old?)", int64(id), int64(first))
	}
	stillHeld(t, l, next, 2500*time.Millisecond) // past giveBack's retries (1 s apart at most)
	if err := next.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// A Release with a short ctx during a background settle fails (ctx's
// error), ends the lease as released and revokes its etcd lease, retried
// in the background while the member hangs; it is never kept. Once the
// member answers, the Locker's next Acquire gets a lock of its own that
// the retried revokes (of the old lease's etcd leases) leave alone, and
// the old lease's end is reported once, as released.
func TestAcquireAfterShortReleaseDuringBackgroundSettle(t *testing.T) {
	rec := &observetest.Recorder{}
	l, _, gate := hungLocker(t, &etcdlock.Options{Observer: rec})
	lease := acquire(t, l, t.Name(), time.Minute)
	first := leaseID(t, lease)
	hangExtend(t, gate, lease)
	if err := lease.Release(ctxFor(t, 200*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release with a short ctx during the settle = %v, want ctx's error", err)
	}
	gate.resume()
	waitSettled(t, l, 5*time.Second)
	// The key is freed by the revokes retried in the background.
	waitNoKeys(t, newClient(t, shared.Endpoints(), nil), l.Prefix(t.Name()), 10*time.Second)
	next := acquire(t, l, t.Name(), time.Minute)
	defer next.Release(context.Background())
	if id := leaseID(t, next); id == first {
		t.Fatalf("next Acquire reused etcd lease %x, revoked by the failed Release", int64(first))
	}
	stillHeld(t, l, next, 2500*time.Millisecond)
	if err := next.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	ends := rec.WaitEnds(t, 2, 5*time.Second)
	if len(ends) != 2 || ends[0].Token != lease.Token() || ends[0].Cause != fence.Released {
		t.Errorf("LeaseEnded %+v, want the first lease's, released, then the next's", ends)
	}
}

// endCallback is an Observer that calls fn with each lease's end, after
// recording it.
type endCallback struct {
	observetest.Recorder
	fn func(fence.LeaseEvent)
}

func (o *endCallback) LeaseEnded(e fence.LeaseEvent) {
	o.Recorder.LeaseEnded(e)
	o.fn(e)
}

// The Observer, told of the release of another lease of the same Locker
// while a lease's Extend settles in the background, calls that lease
// back with a ctx that never ends (Extend, then Release): they wait for
// the settle (ls.op), which takes nothing the callback holds, so the
// Release that reported the end returns once the settle has given up
// (about a second), and the callback's calls say lost.
func TestOtherLeaseEndCallbackDuringBackgroundSettle(t *testing.T) {
	type result struct{ extend, release error }
	var (
		settling fence.Lease
		other    fence.Token
		res      = make(chan result, 1)
	)
	obs := &endCallback{}
	obs.fn = func(e fence.LeaseEvent) {
		if e.Token != other {
			return
		}
		var r result
		r.extend = settling.Extend(context.Background(), time.Minute)
		r.release = settling.Release(context.Background())
		res <- r
	}
	l, _, gate := hungLocker(t, &etcdlock.Options{Observer: obs})
	settling = acquire(t, l, t.Name()+"-a", 30*time.Second)
	lease := acquire(t, l, t.Name()+"-b", 30*time.Second)
	other = lease.Token()
	hangExtend(t, gate, settling)
	start := time.Now()
	released := make(chan error, 1)
	go func() { released <- lease.Release(ctxFor(t, 10*time.Second)) }()
	select {
	case err := <-released:
		t.Logf("Release of the other lease = %v after %v (its Observer's calls included)", err, time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Errorf("Release of the other lease = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("Release of the other lease still waiting 5 s later (its Observer's calls on the settling lease):\n%s", observetest.Stacks())
	}
	r := <-res
	if !errors.Is(r.extend, fence.ErrLeaseLost) || !errors.Is(r.release, fence.ErrLeaseLost) {
		t.Errorf("from the callback: Extend = %v, Release = %v; want both lost (the settle gave up)", r.extend, r.release)
	}
	resumeOnceSettled(t, l, gate, l.Prefix(t.Name()+"-a"))
	ends := obs.WaitEnds(t, 2, 5*time.Second)
	if len(ends) != 2 {
		t.Errorf("LeaseEnded %+v, want two", ends)
	}
	for _, e := range ends {
		if e.Token == settling.Token() && e.Cause == fence.Released {
			t.Errorf("the settling lease's end %+v, want lost", e)
		}
	}
}
