package fencerueidis_test

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

// refusedSignal is a slog.Handler that signals each record on a channel.
type refusedSignal struct{ c chan struct{} }

func (h refusedSignal) Enabled(context.Context, slog.Level) bool { return true }
func (h refusedSignal) Handle(context.Context, slog.Record) error {
	select {
	case h.c <- struct{}{}:
	default:
	}
	return nil
}
func (h refusedSignal) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h refusedSignal) WithGroup(string) slog.Handler      { return h }

// TestRefusedGrantKept: over rueidis, a waiter whose confirmation of its
// grant is refused by replica sync reads acquire.lua's four-element reply
// (the lock its own already) as redislock does over go-redis: it keeps the
// lock, its expiry brought down to its budget, and its withdrawal at the
// budget's end grants the lock to the next waiter.
func TestRefusedGrantKept(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	const name = "refused-grant-kept"
	lock := lockKey(name)
	sync := redislock.ReplicaSync{Timeout: 200 * time.Millisecond}
	holder, err := newLocker(t, client(t, primary.Addr), redislock.Options{ReplicaSync: sync}).Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan struct{}, 16)
	first := newLocker(t, client(t, primary.Addr), redislock.Options{ReplicaSync: sync, Logger: slog.New(refusedSignal{refused})})
	second := newLocker(t, client(t, primary.Addr), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const budget = 2 * time.Second
	firstErr := make(chan error, 1)
	go func() {
		ls, err := first.Acquire(ctx(t), name, fence.Wait(budget), fence.TTL(time.Minute))
		if err == nil {
			_ = ls.Release(context.Background())
			err = errors.New("got a lease with its replica paused")
		}
		firstErr <- err
	}()
	waitFor(t, func() bool { return admin.LLen(ctx(t), lock+":queue").Val() == 1 })
	firstOwner := admin.LIndex(ctx(t), lock+":queue", 0).Val()
	type got struct {
		ls  fence.Lease
		err error
	}
	secondGot := make(chan got, 1)
	go func() {
		ls, err := second.Acquire(ctx(t), name, fence.Wait(time.Minute), fence.TTL(time.Minute))
		secondGot <- got{ls, err}
	}()
	waitFor(t, func() bool { return admin.LLen(ctx(t), lock+":queue").Val() == 2 })
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
	waitFor(t, func() bool {
		return admin.Get(ctx(t), lock).Val() != firstOwner || admin.PTTL(ctx(t), lock).Val() <= budget
	})
	if owner := admin.Get(ctx(t), lock).Val(); owner != firstOwner {
		t.Fatalf("after its refused confirmation the lock is %q, not kept by the first waiter %q", owner, firstOwner)
	}
	select {
	case err := <-firstErr:
		if !errors.Is(err, fence.ErrNotReplicated) {
			t.Fatalf("the first waiter: %v, want ErrNotReplicated", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first waiter (budget 2 s) has not returned after 10 s")
	}
	select {
	case r := <-secondGot:
		if r.err != nil {
			t.Fatalf("the second waiter: %v", r.err)
		}
		if err := r.ls.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the second waiter has no lease 10 s after the first's budget ended; the lock is %q (PTTL %v)",
			admin.Get(ctx(t), lock).Val(), admin.PTTL(ctx(t), lock).Val())
	}
}
