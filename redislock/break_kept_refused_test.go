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

// TestKeptRefusedGrantExpiryWithinBudget: a waiter's grant holds the lock
// for its lease or what is left of its wait budget if less (grant.lua: a
// waiter that died holds the lock no longer than it would have waited).
// Its confirmation refused by replica sync, the waiter keeps the lock
// (ad53203); the refused try should not have moved the lock's expiry past
// the budget: a waiter that dies (or whose client is closed) during its
// back-off would leave the lock held by nobody for its whole lease.
func TestKeptRefusedGrantExpiryWithinBudget(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	const name = "lock:kept-refused-expiry"
	lock := lockKey(name)
	sync := redislock.ReplicaSync{Timeout: 200 * time.Millisecond}
	holder := acquire(t, lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: sync}), name, fence.TTL(time.Minute))
	refused := make(chan struct{}, 16)
	firstClient := primary.Client(t)
	first := lockerWith(t, firstClient, redislock.Options{ReplicaSync: sync, Logger: slog.New(signalHandler{refused})})
	const budget = 3 * time.Second
	firstErr := make(chan error, 1)
	go func() {
		ls, err := first.Acquire(ctx(t), name, fence.Wait(budget), fence.TTL(time.Minute))
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
		t.Fatalf("after its refused confirmation the lock is %q, not the first waiter's %q", owner, firstOwner)
	}
	// The waiter's process dies here (its client closed: nothing more is
	// sent for it).
	_ = firstClient.Close()
	<-firstErr
	if pttl := admin.PTTL(ctx(t), lock).Val(); pttl > budget {
		t.Fatalf("the dead waiter's kept lock expires in %v, past its %v wait budget (its lease time: 1m)", pttl, budget)
	}
}
