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

// TestRedisStoreFailoverClusterClientClockTokens: go-redis's Sentinel
// client that routes reads to replicas (NewFailoverClusterClient) is a
// *redis.ClusterClient given its slots (the primary and its replicas as
// one range) over servers not in cluster mode: the floor key cannot be in
// "another slot" there, yet ClockTokens was refused on it with
// fence.ErrInvalidOption ("the floor key is in another hash slot"). It
// must work as on the plain failover client: the floor refuses a token
// issued before it, a later one is accepted (confirmed by the replica with
// Replicas), an older one is stale.
//
// The client is built as NewFailoverClusterClient builds it, without
// Sentinel: go-redis's Close of a NewFailoverClusterClient leaves its
// Sentinel goroutines running (goleak).
func TestRedisStoreFailoverClusterClientClockTokens(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	c := redis.NewClusterClient(&redis.ClusterOptions{
		RouteByLatency: true,
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: primary.Addr}, {Addr: replica.Addr}}}}, nil
		},
	})
	defer c.Close()
	pc := primary.Client(t)
	for _, replicas := range []int{0, 1} {
		store := clockStore(pc)
		store.Client = c
		store.Replicas, store.ReplicaTimeout = replicas, 500*time.Millisecond
		before := serverMicros(t, pc)
		if err := store.Accept(ctx(t), "payment:1001", before); !errors.Is(err, guard.ErrStoreLost) {
			t.Fatalf("Replicas %d: token issued before the floor: %v, want ErrStoreLost", replicas, err)
		}
		t5 := serverMicros(t, pc) + 10
		acceptThenStale(t, store, t5, t5+2)
	}
}

// TestRedisStoreClusterSlotsRealCluster: a ClusterClient given its slots
// can also front a real cluster (behind NAT): ClockTokens is then let
// through to the server, whose CROSSSLOT refusal must come back typed
// (fence.ErrInvalidOption), with nothing recorded.
func TestRedisStoreClusterSlotsRealCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	probe := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer probe.Close()
	//lint:ignore SA1019 ClusterOptions.ClusterSlots takes CLUSTER SLOTS' shape
	slots, err := probe.ClusterSlots(ctx(t)).Result()
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) { return slots, nil },
	})
	defer c.Close()
	store := redisstore.Store{Client: c, ClockTokens: true, Prefix: "guardtest:slots"}
	err = store.Accept(ctx(t), "payment:1001", 1<<60)
	if !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("ClockTokens on a real cluster through ClusterSlots: %v, want fence.ErrInvalidOption", err)
	}
	if n, _ := probe.Exists(ctx(t), "guardtest:slots:{payment:1001}").Result(); n != 0 {
		t.Fatal("token recorded")
	}
}
