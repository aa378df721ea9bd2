package redislock_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestRingShardReadTimeout: a Ring's shards are made by RingOptions.NewClient,
// which may give them options of their own (a shorter ReadTimeout, or a
// Sentinel failover client per shard, whose FailoverOptions carry their
// own). The sync timeout was fitted to the Ring's ReadTimeout (unset: 5 s,
// so 1 s), not to the shard's (400 ms), and an Acquire with the shard's
// replica paused got the shard client's i/o timeout, not
// fence.ErrNotReplicated.
func TestRingShardReadTimeout(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	const rt = 400 * time.Millisecond
	ring := redis.NewRing(&redis.RingOptions{
		Addrs: map[string]string{"a": primary.Addr},
		NewClient: func(opt *redis.Options) *redis.Client {
			opt.ReadTimeout, opt.MaxRetries = rt, -1
			return redis.NewClient(opt)
		},
	})
	t.Cleanup(func() { _ = ring.Close() })
	l, err := redislock.New(ring, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1}})
	if errors.Is(err, fence.ErrInvalidOption) {
		return // refused at New: no trap
	}
	if err != nil {
		t.Fatal(err)
	}
	refusedWhilePaused(t, l, replica, "lock:ring-shard", fmt.Sprintf("a Ring whose shards read within %v", rt))
}

// TestClusterNodeReadTimeout: the same with ClusterOptions.NewClient, which
// makes the node clients.
func TestClusterNodeReadTimeout(t *testing.T) {
	t.Parallel() // own cluster; mostly waits on it and the paused replica
	cluster := redistest.StartClusterWithReplicas(t, 3, 1)
	const rt = 400 * time.Millisecond
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: cluster.Addrs(),
		NewClient: func(opt *redis.Options) *redis.Client {
			opt.ReadTimeout, opt.MaxRetries = rt, -1
			return redis.NewClient(opt)
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	const name = "lock:payment:1001"
	_, replica := masterAndReplica(t, cluster, c, name)
	l, err := redislock.New(c, &redislock.Options{})
	if errors.Is(err, fence.ErrInvalidOption) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := tryOnce(t, l, name); err != nil {
		t.Fatal(err) // the Locker has seen the replica
	}
	resume := replica.Pause(t)
	defer resume()
	start := time.Now()
	err = tryOnce(t, l, name)
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Errorf("Acquire on a cluster whose node clients read within %v, replica paused = %v after %v; want fence.ErrNotReplicated", rt, err, time.Since(start).Round(time.Millisecond))
	}
}
