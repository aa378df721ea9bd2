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

// TestFailoverClusterClientReadRouting: a cluster client given its slots
// (as redis.NewFailoverClusterClient builds one: a Sentinel-managed
// primary and its replica as one slot range) with ReadOnly (FailoverOptions'
// ReplicaOnly), RouteRandomly or RouteByLatency puts its subscription
// connections on a replica (go-redis picks a read-only node for them).
// A Locker on it, with replica sync on (Replicas given), waits behind a
// Locker of a plain client of the primary and the other way round: the
// grants published on the primary reach the replica's subscribers (Redis
// replicates PUBLISH and SPUBLISH), the scripts run on the primary, and
// each handoff takes moments, not the old holder's TTL.
func TestFailoverClusterClientReadRouting(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	sync := redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1}}
	plain := newLockerWith(t, primary.Client(t), sync)
	for _, route := range []struct {
		name string
		set  func(*redis.ClusterOptions)
	}{
		{"ReadOnly", func(o *redis.ClusterOptions) { o.ReadOnly = true }},
		{"RouteRandomly", func(o *redis.ClusterOptions) { o.RouteRandomly = true }},
		{"RouteByLatency", func(o *redis.ClusterOptions) { o.RouteByLatency = true }},
	} {
		t.Run(route.name, func(t *testing.T) {
			failover := newLockerWith(t, failoverClusterClient(t, route.set, primary.Addr, replica.Addr), sync)
			for _, tc := range []struct {
				name           string
				holder, waiter *redislock.Locker
			}{
				{"client releases to cluster client", plain, failover},
				{"cluster client releases to client", failover, plain},
				{"cluster client releases to itself", failover, failover},
			} {
				for round := range 3 { // RouteRandomly: one of them on the replica, very likely
					name := "lock:failover-route:" + route.name + ":" + tc.name + string(rune('0'+round))
					holder := acquire(t, tc.holder, name, fence.TTL(time.Minute))
					got := make(chan error, 1)
					wctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
					go func() {
						ls, err := tc.waiter.Acquire(wctx, name, fence.Wait(time.Minute), fence.TTL(time.Minute))
						if err == nil {
							err = ls.Release(context.Background())
						}
						got <- err
					}()
					admin := primary.Client(t)
					ch := lockKey(name) + ":released"
					rc := replica.Client(t)
					waitFor(t, func() bool {
						return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 &&
							admin.PubSubNumSub(ctx(t), ch).Val()[ch]+admin.PubSubShardNumSub(ctx(t), ch).Val()[ch]+
								rc.PubSubNumSub(ctx(t), ch).Val()[ch]+rc.PubSubShardNumSub(ctx(t), ch).Val()[ch] >= 1
					})
					if tc.waiter == failover {
						t.Logf("%s: subscribed on the replica: %v", tc.name, rc.PubSubNumSub(ctx(t), ch).Val()[ch]+rc.PubSubShardNumSub(ctx(t), ch).Val()[ch] > 0)
					}
					released := time.Now()
					if err := holder.Release(ctx(t)); err != nil {
						t.Fatal(err)
					}
					err := <-got
					cancel()
					if err != nil {
						t.Fatalf("%s: the waiter did not get the lock %v after the release: %v", tc.name, time.Since(released).Round(time.Millisecond), err)
					}
					if took := time.Since(released); took > 5*time.Second {
						t.Fatalf("%s: the waiter got the lock %v after the release", tc.name, took)
					}
				}
			}
		})
	}
}

// failoverClusterClient returns a cluster client given its slots, as
// redis.NewFailoverClusterClient builds one: the whole slot range on the
// servers at addrs, the primary's first, with set (its routing of reads),
// if not nil, applied to its options. It is closed in t.Cleanup.
func failoverClusterClient(t *testing.T, set func(*redis.ClusterOptions), addrs ...string) *redis.ClusterClient {
	t.Helper()
	nodes := make([]redis.ClusterNode, len(addrs))
	for i, addr := range addrs {
		nodes[i] = redis.ClusterNode{Addr: addr}
	}
	o := &redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: nodes}}, nil
		},
	}
	if set != nil {
		set(o)
	}
	cc := redis.NewClusterClient(o)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}
