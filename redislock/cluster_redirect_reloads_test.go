package redislock_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestRedirectUnlistedReloads counts the CLUSTER SLOTS calls that 50
// Acquires, without a wait, of a lock in a slot moved to a node the map
// leaves out cause: one reload each by MasterByAddr (ForEachShard's
// ReloadOrGet, not go-redis's deduplicated LazyReload), and go-redis's own
// lazy ones. (A MasterByAddr that looked again at every back-off step for
// 2 s made 715, and 2 s.)
func TestRedirectUnlistedReloads(t *testing.T) {
	const name = "lock:redirect-reloads"
	c, hc, from, to := movedSlot(t, name)
	var hide atomic.Bool
	var calls atomic.Int64
	edit := hideNode(from, to, hide.Load)
	cc := slotsClient(t, c, func(s []redis.ClusterSlot) []redis.ClusterSlot { calls.Add(1); return edit(s) })
	l := newLockerWith(t, cc, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err := acquire(t, l, name).Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := c.MigrateSlot(ctx(t), int(hc.ClusterKeySlot(ctx(t), lockKey(name)).Val()), from, to); err != nil {
		t.Fatal(err)
	}
	hide.Store(true)
	calls.Store(0)
	start := time.Now()
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			_, _ = l.Acquire(ctx(t), name, fence.Wait(0))
		})
	}
	wg.Wait()
	t.Logf("50 Acquires: %v, %d CLUSTER SLOTS", time.Since(start), calls.Load())
	if n := calls.Load(); n > 150 {
		t.Fatalf("%d CLUSTER SLOTS for 50 failed Acquires", n)
	}
}
