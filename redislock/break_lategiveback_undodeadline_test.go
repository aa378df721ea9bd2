package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redislock"
)

// TestRefusedTakeUndoHungWithinDeadline: 44610fb bounds the wait for a late
// take's give-back by the wait budget; its sibling, the undo of a take that
// replica sync refused (its WAIT counted no replica), is waited for on a
// context cut from the caller's (WithoutCancel) for the sync timeout or a
// second. When that undo hangs (the server stopped answering right after
// the WAIT's reply), the Acquire is held up to a second past its wait
// budget and past ctx's deadline, though Acquire returns by ctx's deadline
// (but for 250 ms at least given to that undo). Here the first try
// (on ctx alone) is refused at about 200 ms, the undo is held on its way,
// and ctx ends at 700 ms (budget 500 ms): the Acquire returned after
// some 1.2 s. It should return by ctx's deadline, the undo going on in the
// background (WaitGiveBacks), the lock free once it gets through.
func TestRefusedTakeUndoHungWithinDeadline(t *testing.T) {
	const name = "lock:refused-undo-deadline"
	const deadline, wait = 700 * time.Millisecond, 500 * time.Millisecond
	lock := lockKey(name)
	srv, replica, tr, c := heldUndo(t, name, 5*time.Second)
	admin := srv.Client(t)
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 200 * time.Millisecond}})
	resume := replica.Pause(t)
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()
	start := time.Now()
	got := make(chan acquired, 1)
	go func() {
		cx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		ls, err := l.Acquire(cx, name, fence.TTL(time.Minute), fence.Wait(wait))
		got <- acquired{ls, err}
	}()
	var r acquired
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire has not returned after 10 s")
	}
	took := time.Since(start)
	held := tr.holding()
	if err := tr.deliver(); err != nil {
		t.Fatal(err)
	}
	resume()
	resumed = true
	if r.lease != nil {
		t.Fatalf("Acquire returned a lease (token %d) with its replica paused", r.lease.Token())
	}
	if !errors.Is(r.err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire = %v, want ErrNotAcquired", r.err)
	}
	if !held {
		t.Fatalf("the undo was not held (Acquire: %v): the test did not hang it", r.err)
	}
	t.Logf("Acquire after %v (ctx's deadline %v, budget %v), its undo hung: %v", took.Round(time.Millisecond), deadline, wait, r.err)
	if took > deadline+250*time.Millisecond {
		t.Errorf("Acquire with ctx's deadline at %v returned after %v: it waited for the hung undo of its refused take past ctx's deadline", deadline, took.Round(time.Millisecond))
	}
	if err := l.WaitGiveBacks(ctx(t)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return admin.Exists(ctx(t), lock).Val() == 0 })
}
