package redislock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// forgedGrant is a grant message as the scripts publish it, to owner, for
// px ms, with a MAC nobody signed: what a client that may publish on the
// release channel, but cannot read fence's keys, can send.
func forgedGrant(owner string, px int64) string {
	return fmt.Sprintf("g %s %d %d 1 0 %040x", owner, int64(1)<<52, px, 0)
}

// TestForgedGrantsDoNotPostponeWaiters: a client that may publish on the
// lock's release channel but cannot read the keys sends two grants to an
// owner that does not wait: a short one, then one for a very long time.
// A waiter cannot check a grant to another owner (it does not know that
// owner's secret), and it moves its timer to the end of such grants (the
// lock is granted on: see Locker.deliver). The holder then dies: nobody
// releases, its lock expires, and only the waiter's timer, at the
// holder's TTL, brings it to try. A forger must not be able to move that
// timer past the holder's TTL: the waiter would sleep through its whole
// budget, with the lock free, and end with ErrHeld.
func TestForgedGrantsDoNotPostponeWaiters(t *testing.T) {
	t.Run("sync-off", func(t *testing.T) {
		srv := redistest.Start(t)
		forgedPostpone(t, srv, srv.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	})
	t.Run("sync-on", func(t *testing.T) {
		primary := redistest.Start(t)
		redistest.StartReplica(t, primary)
		redistest.WaitReplicated(t, primary, 1)
		forgedPostpone(t, primary, primary.Client(t), redislock.Options{})
	})
}

func forgedPostpone(t *testing.T, srv *redistest.Server, forger *redis.Client, o redislock.Options) {
	const name, holderTTL, budget = "lock:forged-postpone", 500 * time.Millisecond, 4 * time.Second
	admin := srv.Client(t)
	// The holder dies holding the lock: nobody releases it.
	crashed := redis.NewClient(&redis.Options{Addr: srv.Addr})
	acquire(t, lockerWith(t, crashed, o), name, fence.TTL(holderTTL))
	_ = crashed.Close()
	start := time.Now()

	got := make(chan error, 1)
	go func() {
		ls, err := lockerWith(t, srv.Client(t), o).Acquire(ctx(t), name, fence.Wait(budget), fence.TTL(time.Second))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		got <- err
	}()
	waitFor(t, func() bool { return subscribers(t, admin, name) == 1 })
	other := fmt.Sprintf("%032x", 7)
	ch := lockKey(name) + ":released"
	for _, px := range []int64{100, 1e9} {
		if err := forger.Publish(ctx(t), ch, forgedGrant(other, px)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter, after two forged grants to another owner, %v after the holder (TTL %v) died: %v", time.Since(start).Round(time.Millisecond), holderTTL, err)
	}
	if took := time.Since(start); took > holderTTL+time.Second {
		t.Fatalf("the waiter took the lock %v after the holder (TTL %v) died", took, holderTTL)
	}
}
