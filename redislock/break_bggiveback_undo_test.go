package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestRefusedTakeUndoInFlightFirstTry attacks aee9de2: the undo of a take
// refused by replica sync, held on its way, goes on in the background once
// the Acquire stops waiting for it. The Acquire must return no lease (its
// owner's undo may still delete the lock), the caller's own revoked
// give-back must free the lock, and the held undo, delivered once the same
// Locker has taken the lock again, must leave that lease's lock alone.
// (The confirmation of a grant that a waiting Acquire's try refused was
// undone too, TestRefusedTakeUndoInFlightWaitingTry; the waiter keeps it
// now, TestRefusedGrantKeepsPlace, and gives it back only by its
// withdrawal, TestRefusedGrantGivenBackAtBudgetEnd.)
func TestRefusedTakeUndoInFlightFirstTry(t *testing.T) {
	srv := redistest.Start(t)
	replica := redistest.StartReplica(t, srv)
	redistest.WaitReplicated(t, srv, 1)
	admin := srv.Client(t)
	name := "lock:refused-undo-inflight"
	lock := lockKey(name)
	other := lockerWith(t, srv.Client(t), redislock.Options{})
	if err := acquire(t, other, "lock:warm-up").Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	tr := &transit{match: fmt.Appendf(nil, "$1\r\n%d\r\n$%d\r\n%s\r\n", redislock.ReleaseKeys, len(lock), lock)}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: tr.dial, ReadTimeout: 5 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 200 * time.Millisecond}})
	// Warm l's connection and scripts.
	if err := acquire(t, l, "lock:warm-up-l").Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	tr.arm()
	resume := replica.Pause(t)
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()
	got := make(chan acquired, 1)
	go func() {
		cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ls, err := l.Acquire(cx, name, fence.TTL(time.Minute), fence.Wait(3*time.Second))
		got <- acquired{ls, err}
	}()
	var r acquired
	select {
	case r = <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("Acquire has not returned after 15 s")
	}
	if !tr.holding() {
		t.Fatalf("the undo was not held (Acquire: %v, lease %v)", r.err, r.lease)
	}
	if r.lease != nil {
		t.Fatalf("Acquire returned a lease (token %d) with its replica paused and its undo in flight", r.lease.Token())
	}
	t.Logf("Acquire, its undo held: %v", r.err)
	if !errors.Is(r.err, fence.ErrNotAcquired) {
		t.Errorf("Acquire = %v, want ErrNotAcquired", r.err)
	}
	resume()
	resumed = true
	if err := l.WaitGiveBacks(ctx(t)); err != nil {
		t.Fatal(err)
	}
	// The caller's revoked give-back freed the lock, the undo still held.
	waitFor(t, func() bool { return admin.Exists(ctx(t), lock).Val() == 0 })
	// The same Locker takes it again (a new Acquire: a new owner).
	again, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute), fence.Wait(3*time.Second))
	if err != nil {
		t.Fatalf("Acquire after the refused one's give-back: %v", err)
	}
	t.Cleanup(func() { _ = again.Release(context.Background()) })
	owner := admin.Get(ctx(t), lock).Val()
	before := commandCalls(t, admin, "evalsha") + commandCalls(t, admin, "eval")
	if err := tr.deliver(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return commandCalls(t, admin, "evalsha")+commandCalls(t, admin, "eval") > before })
	if now := admin.Get(ctx(t), lock).Val(); now != owner || again.Err() != nil {
		t.Fatalf("the refused Acquire's undo, delivered late, changed the lock of a later lease of the same Locker: %q, was %q (lease Err %v)", now, owner, again.Err())
	}
	if err := again.Release(ctx(t)); err != nil {
		t.Errorf("Release of the later lease: %v", err)
	}
}
