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
	"github.com/redis/go-redis/v9"
)

// TestClusterRefusedGrantKept: on a cluster, a waiter refused confirming
// its grant (the replica of the lock's master paused) keeps the lock, its
// expiry brought down to its budget through the slot's master (keep.lua,
// sent as the acquire script is), and its withdrawal at the budget's end
// grants the lock to the next waiter.
func TestClusterRefusedGrantKept(t *testing.T) {
	t.Parallel() // own cluster; mostly waits for it to start
	cluster := redistest.StartClusterWithReplicas(t, 3, 1)
	newClient := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	const name = "lock:cluster-refused-kept"
	lock := lockKey(name)
	admin := newClient()
	master, replica := masterAndReplica(t, cluster, admin, name)
	mc := master.Client(t)
	sync := redislock.ReplicaSync{Timeout: 200 * time.Millisecond}
	holder := acquire(t, lockerWith(t, newClient(), redislock.Options{ReplicaSync: sync}), name, fence.TTL(time.Minute))
	refused := make(chan struct{}, 16)
	first := lockerWith(t, newClient(), redislock.Options{ReplicaSync: sync, Logger: slog.New(signalHandler{refused})})
	second := lockerWith(t, newClient(), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
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
	waitFor(t, func() bool { return mc.LLen(ctx(t), lock+":queue").Val() == 1 })
	firstOwner := mc.LIndex(ctx(t), lock+":queue", 0).Val()
	secondGot := make(chan acquired, 1)
	go func() {
		ls, err := second.Acquire(ctx(t), name, fence.Wait(time.Minute), fence.TTL(time.Minute))
		secondGot <- acquired{ls, err}
	}()
	waitFor(t, func() bool { return mc.LLen(ctx(t), lock+":queue").Val() == 2 })
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
		return mc.Get(ctx(t), lock).Val() != firstOwner || mc.PTTL(ctx(t), lock).Val() <= budget
	})
	if owner := mc.Get(ctx(t), lock).Val(); owner != firstOwner {
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
		if err := r.lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the second waiter has no lease 10 s after the first's budget ended; the lock is %q (PTTL %v)",
			mc.Get(ctx(t), lock).Val(), mc.PTTL(ctx(t), lock).Val())
	}
}
