package redislock_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// signalHandler is a slog.Handler that signals each record on a channel.
type signalHandler struct{ c chan struct{} }

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) Handle(context.Context, slog.Record) error {
	select {
	case h.c <- struct{}{}:
	default:
	}
	return nil
}
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalHandler) WithGroup(string) slog.Handler      { return h }

// TestRefusedGrantKeepsPlace: waiters of two Lockers (as two processes)
// queue in order, first then second, with replica sync on. The replica
// stops while the lock is handed to the first: its confirmation of the
// grant is refused (too few acknowledgements), and the lock, given back,
// is granted to the second, while the first queues again, behind it. Once
// the replica is back, the first in line should get the lock first.
func TestRefusedGrantKeepsPlace(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	const name = "lock:refused-fifo"
	sync := redislock.ReplicaSync{Timeout: 200 * time.Millisecond}
	holder := acquire(t, lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: sync}), name, fence.TTL(time.Minute))
	refused := make(chan struct{}, 1)
	first := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: sync, Logger: slog.New(signalHandler{refused})})
	second := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: sync})
	order := make(chan string, 2)
	wait := func(l *redislock.Locker, who string) {
		ls, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err != nil {
			order <- who + " failed (" + err.Error() + ")"
			return
		}
		order <- who
		_ = ls.Release(context.Background())
	}
	go wait(first, "first")
	waitFor(t, func() bool {
		return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 && subscribers(t, admin, name) == 1
	})
	go wait(second, "second")
	waitFor(t, func() bool {
		return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 2 && subscribers(t, admin, name) == 2
	})

	resume := replica.Pause(t)
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	<-refused // the first's confirmation of its grant
	resume()
	if got := <-order; got != "first" {
		t.Fatalf("after the refused confirmation, %s waiter got the lock first; want the first in line", got)
	}
	if got := <-order; got != "second" {
		t.Fatalf("then %s; want the second", got)
	}
}

// TestRefusedGrantGivenBackAtBudgetEnd: a waiter whose confirmations of
// its grant are refused (its replica paused) keeps the lock while its
// budget lasts; when the budget ends, its withdrawal gives the lock back
// and grants it to the next waiter (of a Locker without replica sync, as
// another process) at once, not when that waiter's own timer ends (the
// holder's TTL: a minute).
func TestRefusedGrantGivenBackAtBudgetEnd(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	const name = "lock:refused-budget-end"
	lock := lockKey(name)
	sync := redislock.ReplicaSync{Timeout: 200 * time.Millisecond}
	holder := acquire(t, lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: sync}), name, fence.TTL(time.Minute))
	refused := make(chan struct{}, 16)
	first := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: sync, Logger: slog.New(signalHandler{refused})})
	second := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	firstErr := make(chan error, 1)
	go func() {
		ls, err := first.Acquire(ctx(t), name, fence.Wait(2*time.Second), fence.TTL(time.Minute))
		if err == nil {
			_ = ls.Release(context.Background())
			err = errors.New("got a lease with its replica paused")
		}
		firstErr <- err
	}()
	waitFor(t, func() bool {
		return admin.LLen(ctx(t), lock+":queue").Val() == 1 && subscribers(t, admin, name) == 1
	})
	firstOwner := admin.LIndex(ctx(t), lock+":queue", 0).Val()
	secondGot := make(chan acquired, 1)
	go func() {
		ls, err := second.Acquire(ctx(t), name, fence.Wait(time.Minute), fence.TTL(time.Minute))
		secondGot <- acquired{ls, err}
	}()
	waitFor(t, func() bool {
		return admin.LLen(ctx(t), lock+":queue").Val() == 2 && subscribers(t, admin, name) == 2
	})

	resume := replica.Pause(t)
	defer resume()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-refused:
	case <-time.After(10 * time.Second):
		t.Fatal("no refused confirmation within 10 s")
	}
	if owner := admin.Get(ctx(t), lock).Val(); owner != firstOwner {
		t.Fatalf("after its refused confirmation the lock is %q, not kept by the first waiter %q", owner, firstOwner)
	}
	select {
	case err := <-firstErr:
		if !errors.Is(err, fence.ErrNotReplicated) {
			t.Fatalf("the first waiter: %v, want ErrNotReplicated", err)
		}
		// Given back before Acquire returned, as a refused take is.
		if owner := admin.Get(ctx(t), lock).Val(); owner == firstOwner {
			t.Fatalf("Acquire returned %v with the lock still kept by its owner", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first waiter (budget 2 s) has not returned after 10 s")
	}
	select {
	case r := <-secondGot:
		if r.err != nil {
			t.Fatalf("the second waiter: %v", r.err)
		}
		if err := r.lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the second waiter has no lease 10 s after the first's budget ended; the lock is %q (PTTL %v)",
			admin.Get(ctx(t), lock).Val(), admin.PTTL(ctx(t), lock).Val())
	}
}
