package redislock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestFailoverClusterClientWaiterAcrossFailover: Lockers on cluster clients
// given their slots as redis.NewFailoverClusterClient gives them (the
// current primary, then its replica; reloaded on a failover, as its
// Sentinel callback does), replica sync off. A waiter waits while the
// primary is killed and its replica promoted: its subscription, on the
// dead primary, is made again on the new one, and the holder's release
// (replicated before the failover) there grants it the lock within
// moments, both ways subscribed.
func TestFailoverClusterClientWaiterAcrossFailover(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	var master atomic.Pointer[string]
	master.Store(&primary.Addr)
	newClient := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{
			ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
				nodes := []redis.ClusterNode{{Addr: *master.Load()}}
				if *master.Load() == primary.Addr {
					nodes = append(nodes, redis.ClusterNode{Addr: replica.Addr})
				}
				return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: nodes}}, nil
			},
			MaxRetries: -1,
		})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	hc, wc := newClient(), newClient()
	off := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	holderL, waiterL := newLockerWith(t, hc, off), newLockerWith(t, wc, off)
	const name = "lock:failover-cluster-failover"
	holder := acquire(t, holderL, name, fence.TTL(time.Minute))
	got := make(chan error, 1)
	wctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	go func() {
		ls, err := waiterL.Acquire(wctx, name, fence.Wait(time.Minute), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(context.Background())
		}
		got <- err
	}()
	admin := primary.Client(t)
	ch := lockKey(name) + ":released"
	waitFor(t, func() bool {
		return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 && admin.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1
	})
	redistest.Failover(t, primary, replica)
	master.Store(&replica.Addr)
	hc.ReloadState(ctx(t))
	wc.ReloadState(ctx(t))
	rc := replica.Client(t)
	waitFor(t, func() bool { // subscribed again, on the new primary
		return rc.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1
	})
	released := time.Now()
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatalf("Release on the promoted replica: %v", err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the waiter, %v after the release: %v", time.Since(released).Round(time.Millisecond), err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter did not get the lock within 15 s of the release")
	}
	if took := time.Since(released); took > 5*time.Second {
		t.Fatalf("the waiter got the lock %v after the release", took)
	}
}
