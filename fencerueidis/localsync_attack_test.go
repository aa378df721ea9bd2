package fencerueidis_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// Attacks on the synced local handoff over rueidis (redislock's
// Locker.releaseLease through the Conn): a Release of a Locker with an
// Acquire waiting sends WAIT with its script, and the waiter it grants
// takes the grant without confirming it only if enough replicas
// acknowledged.

// queuedWaiter starts an Acquire on l that waits for name (held) and
// returns once it is queued, subscribed and has made its second try.
func queuedWaiter(t *testing.T, l *redislock.Locker, admin *redis.Client, name string, budget, ttl time.Duration) (<-chan fence.Lease, <-chan error) {
	t.Helper()
	leases, errs := make(chan fence.Lease, 1), make(chan error, 1)
	go func() {
		ls, err := l.Acquire(ctx(t), name, fence.Wait(budget), fence.TTL(ttl))
		if err != nil {
			errs <- err
			return
		}
		leases <- ls
	}()
	channel := lockKey(name) + ":released"
	waitFor(t, func() bool {
		vals := admin.HVals(ctx(t), lockKey(name)+":waiters").Val()
		subs := admin.PubSubNumSub(ctx(t), channel).Val()[channel]
		return subs == 1 && len(vals) == 1 && len(strings.Fields(vals[0])) > 1 && strings.Fields(vals[0])[1] == "2"
	})
	return leases, errs
}

// TestLocalHandoffSynced: the waiter takes the grant of its Locker's
// Release, and the replica has the waiter's token record by the time its
// Acquire returns; with the replica cut off, the waiter must not take the
// grant, and its Acquire fails with ErrNotReplicated while Release
// reports the deletion.
func TestLocalHandoffSynced(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	l := newLocker(t, client(t, primary.Addr), redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})

	const name = "local-handoff"
	holder, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	leases, errs := queuedWaiter(t, l, admin, name, 20*time.Second, 10*time.Second)
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case ls := <-leases:
		rec, err := replica.Client(t).Get(ctx(t), lockKey(name)+":token").Result()
		if err != nil || rec != strconv.FormatInt(int64(ls.Token()), 10) {
			t.Fatalf("the replica's token record reads %q (%v) when the lease of token %d was returned", rec, err, ls.Token())
		}
		if ls.Token() <= holder.Token() {
			t.Fatalf("token %d after %d", ls.Token(), holder.Token())
		}
		if err := ls.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	case err := <-errs:
		t.Fatal(err)
	}

	const cut = "local-handoff-cut"
	holder, err = l.Acquire(ctx(t), cut, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	leases, errs = queuedWaiter(t, l, admin, cut, 3*time.Second, time.Second)
	redistest.CutLink(t, primary, replica)
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatalf("Release with the replica cut off: %v, want nil (the lock was deleted)", err)
	}
	select {
	case ls := <-leases:
		t.Fatalf("took the lock with token %d with its replica cut off", ls.Token())
	case err := <-errs:
		if !errors.Is(err, fence.ErrNotReplicated) {
			t.Fatalf("Acquire = %v, want ErrNotReplicated", err)
		}
	}
}
