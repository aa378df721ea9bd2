package redislock_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redislock"
)

// TestKeptGrantWithdrawalHungWithinBudget: a waiter (ctx without a
// deadline, budget 1 s) is granted the lock, its confirmation is refused
// (replica paused) and it keeps the lock (ad53203); at the budget's end
// its withdrawal gives the lock back, and 8c36447 waits for that "until
// ctx ends, but 250 ms at least". When the server stops answering that
// withdrawal (its request held on its way; the client has no read
// timeout), a ctx without a deadline never ends: the Acquire waited for
// the withdrawal's own bound, the lease time (a minute here), far past
// its wait budget, where a late take's give-back (giveBackLate) is waited
// for no longer than the budget or 250 ms, whichever is later. The
// Acquire must return while the withdrawal is still held, the withdrawal
// going on in the background (WaitGiveBacks), the lock free once it gets
// through.
func TestKeptGrantWithdrawalHungWithinBudget(t *testing.T) {
	const name = "lock:kept-withdraw-hung"
	const wait = time.Second
	lock := lockKey(name)
	srv, replica, tr, c := heldUndo(t, name, -1) // no read timeout
	admin := srv.Client(t)
	sync := redislock.ReplicaSync{Replicas: 1, Timeout: 200 * time.Millisecond}
	holder := acquire(t, lockerWith(t, srv.Client(t), redislock.Options{ReplicaSync: sync}), name, fence.TTL(time.Minute))
	refused := make(chan struct{}, 16)
	l := lockerWith(t, c, redislock.Options{ReplicaSync: sync, Logger: slog.New(signalHandler{refused})})
	start := make(chan time.Time, 1)
	got := make(chan acquired, 1)
	go func() {
		start <- time.Now()
		ls, err := l.Acquire(context.Background(), name, fence.Wait(wait), fence.TTL(time.Minute))
		got <- acquired{ls, err}
	}()
	began := <-start
	waitFor(t, func() bool {
		return admin.LLen(ctx(t), lock+":queue").Val() == 1 && subscribers(t, admin, name) == 1
	})
	waiter := admin.LIndex(ctx(t), lock+":queue", 0).Val()
	resume := replica.Pause(t)
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-refused:
	case <-time.After(10 * time.Second):
		t.Fatal("no refused confirmation within 10 s")
	}
	if owner := admin.Get(ctx(t), lock).Val(); owner != waiter {
		t.Fatalf("after its refused confirmation the lock is %q, not kept by the waiter %q", owner, waiter)
	}
	var r acquired
	select {
	case r = <-got:
	case <-time.After(10 * wait):
		held := tr.holding()
		_ = tr.deliver()
		r = <-got
		t.Fatalf("Acquire (budget %v, ctx without a deadline) had not returned %v after it began, its kept lock's withdrawal held on its way (%v): it waits for the hung withdrawal past its budget (then: %v)",
			wait, (10 * wait).Round(time.Millisecond), held, r.err)
	}
	took := time.Since(began)
	held := tr.holding()
	if err := tr.deliver(); err != nil {
		t.Fatal(err)
	}
	resume()
	resumed = true
	if r.lease != nil {
		t.Fatalf("Acquire returned a lease (token %d) with its replica paused", r.lease.Token())
	}
	if !errors.Is(r.err, fence.ErrNotReplicated) {
		t.Fatalf("Acquire = %v, want ErrNotReplicated", r.err)
	}
	if !held {
		t.Fatalf("the withdrawal was not held (Acquire: %v): the test did not hang it", r.err)
	}
	t.Logf("Acquire returned after %v (budget %v), its kept lock's withdrawal hung: %v", took.Round(time.Millisecond), wait, r.err)
	if err := l.WaitGiveBacks(ctx(t)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return admin.Exists(ctx(t), lock).Val() == 0 })
}
