package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestRedisStoreOnRingShardDown: redisstore.Store on a *redis.Ring. The
// shard that holds a resource's record stops answering for a moment (a
// pause, a network blip); the Ring's heartbeats mark it down and it hashes
// the resource's keys to the other shard, where there is no record: token
// 5 was accepted after 7, with nothing lost, only unreachable for a
// moment (and each process's Ring decides on its own, so two processes
// can check one resource on two shards at once). redislock's docs count
// on the resource's token check to refuse the older holder after such a
// reshard; redisstore on the same Ring was no check at all. Store now
// refuses a *redis.Ring (fence.ErrInvalidOption): pass a shard's own
// client, a Cluster or a Sentinel client.
func TestRedisStoreOnRingShardDown(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{
		Addrs:              map[string]string{"a": a.Addr, "b": b.Addr},
		HeartbeatFrequency: 50 * time.Millisecond,
		DialTimeout:        200 * time.Millisecond,
		ReadTimeout:        200 * time.Millisecond,
		WriteTimeout:       200 * time.Millisecond,
		MaxRetries:         -1,
	})
	t.Cleanup(func() { _ = ring.Close() })
	store := redisstore.Store{Client: ring}
	err := store.Accept(ctx(t), "payment:1001", 7)
	if errors.Is(err, fence.ErrInvalidOption) {
		return // refused: the fix
	}
	if err != nil {
		t.Fatal(err)
	}
	holder := a
	if n, _ := b.Client(t).Exists(ctx(t), "fence:guard:{payment:1001}").Result(); n == 1 {
		holder = b
	}
	resume := holder.Pause(t)
	defer resume()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, cancel := context.WithTimeout(ctx(t), 300*time.Millisecond)
		err := store.Accept(c, "payment:1001", 5)
		cancel()
		if err == nil {
			t.Fatalf("token 5 accepted after 7 once the Ring marked the record's shard down (nothing lost); want the Ring refused (fence.ErrInvalidOption)")
		}
		if errors.Is(err, guard.ErrStale) {
			t.Fatalf("token 5 refused as stale while the shard is paused: %v", err)
		}
	}
	t.Fatal("the Ring never moved the resource within 10 s: the test did not test a reshard")
}
