package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestClusterSlotsClientWaiterAcrossSlotMove: a real 3-master cluster, and
// a waiter's Locker on a cluster client given ClusterSlots by hand (as
// behind NAT: the function asks a node for CLUSTER SLOTS), which now
// publishes and subscribes both ways. The lock's slot moves to another
// master while it waits: Redis drops its shard subscription, it subscribes
// again where the slot is, and the grant of the release that follows, by a
// Locker of a plain cluster client (SPUBLISH only), reaches it within
// moments; and its own release grants a plain cluster client's waiter.
func TestClusterSlotsClientWaiterAcrossSlotMove(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	seed := redis.NewClient(&redis.Options{Addr: cluster.Addrs()[0]})
	t.Cleanup(func() { _ = seed.Close() })
	byHand := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(ctx context.Context) ([]redis.ClusterSlot, error) {
			//lint:ignore SA1019 ClusterOptions.ClusterSlots takes CLUSTER SLOTS' shape
			return seed.ClusterSlots(ctx).Result()
		},
	})
	t.Cleanup(func() { _ = byHand.Close() })
	hc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { _ = hc.Close() })
	if err := hc.ForEachShard(ctx(t), func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	off := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	const name = "lock:clusterslots-slot-move"
	lock := lockKey(name)
	plain := newLockerWith(t, hc, off)
	waiter := newLockerWith(t, byHand, off)
	holder := acquire(t, plain, name, fence.TTL(time.Minute))
	got := make(chan fence.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		ls, err := waiter.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err != nil {
			errc <- err
			return
		}
		got <- ls
	}()
	node, err := hc.MasterForKey(ctx(t), lock)
	if err != nil {
		t.Fatal(err)
	}
	ch := lock + ":released"
	waitFor(t, func() bool {
		return hc.LLen(ctx(t), lock+":queue").Val() == 1 && node.PubSubShardNumSub(ctx(t), ch).Val()[ch] == 1
	})
	var from, to *redistest.Server
	for _, s := range cluster.Servers {
		if s.Addr == node.Options().Addr {
			from = s
		} else if to == nil {
			to = s
		}
	}
	if err := cluster.MigrateSlot(ctx(t), int(hc.ClusterKeySlot(ctx(t), lock).Val()), from, to); err != nil {
		t.Fatal(err)
	}
	dest := redis.NewClient(&redis.Options{Addr: to.Addr})
	t.Cleanup(func() { _ = dest.Close() })
	// It subscribes again once its client's slot map says where the slot
	// went, with back-off, within moments. (Two loaded fresh-clone runs
	// found no subscription there after 10 s: the waiter had failed, its
	// try redirected to a node its map listed as ":port", a node that had
	// not learned its own IP yet; see TestRedirectToNodeListedWithoutHost.)
	moved := time.Now()
	for dest.PubSubShardNumSub(ctx(t), ch).Val()[ch] != 1 {
		select {
		case err := <-errc:
			t.Fatalf("the waiter failed %v after the slot move: %v", time.Since(moved), err)
		default:
		}
		if time.Since(moved) > 10*time.Second {
			t.Fatalf("the waiter did not subscribe where the slot went within 10 s (queue %d, subscribers at the old node %d)",
				hc.LLen(ctx(t), lock+":queue").Val(), node.PubSubShardNumSub(ctx(t), ch).Val()[ch])
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	t.Logf("subscribed where the slot went %v after the move", time.Since(moved).Round(time.Millisecond))
	released := time.Now()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	var mine fence.Lease
	select {
	case mine = <-got:
	case err := <-errc:
		t.Fatalf("the waiter after the slot move: %v", err)
	}
	if took := time.Since(released); took > 5*time.Second {
		t.Fatalf("the waiter got the lock %v after the release", took)
	}
	// And the other way: its release grants a plain cluster client's waiter.
	go func() {
		ls, err := plain.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		errc <- err
	}()
	waitFor(t, func() bool {
		return hc.LLen(ctx(t), lock+":queue").Val() == 1 && dest.PubSubShardNumSub(ctx(t), ch).Val()[ch] >= 1
	})
	released = time.Now()
	if err := mine.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(released); took > 5*time.Second {
		t.Fatalf("the plain waiter got the lock %v after the release", took)
	}
}
