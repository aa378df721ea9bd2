package guard_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestRedisStoreReplicasSlotMoved: with Replicas on a *redis.ClusterClient
// the script and WAIT go to the node MasterForKey names from the client's
// cached slot map; after the resource's slot moved to another master that
// node answers MOVED, and the cluster client, which never saw the MOVED,
// keeps its map for up to 10 s: every Accept of the resource failed with
// a raw "MOVED" meanwhile. After a migration Accept must succeed.
func TestRedisStoreReplicasSlotMoved(t *testing.T) {
	cl := redistest.StartClusterWithReplicas(t, 3, 1)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer c.Close()
	store := redisstore.Store{Client: c, Replicas: 1, ReplicaTimeout: 500 * time.Millisecond}
	const resource = "payment:1001"
	key := "fence:guard:{" + resource + "}"
	deadline := time.Now().Add(30 * time.Second)
	tok := int64(10)
	acceptOnce := func() error { tok++; return store.Accept(ctx(t), resource, fenceToken(tok)) }
	for { // the replicas may still be syncing
		err := acceptOnce()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	slot, err := c.ClusterKeySlot(ctx(t), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	master, err := c.MasterForKey(ctx(t), key)
	if err != nil {
		t.Fatal(err)
	}
	var from, to *redistest.Server
	for _, s := range cl.Servers {
		if s.Addr == master.Options().Addr {
			from = s
		} else if to == nil {
			to = s
		}
	}
	if err := cl.MigrateSlot(ctx(t), int(slot), from, to); err != nil {
		t.Fatal(err)
	}
	if err := acceptOnce(); err != nil {
		t.Fatalf("Accept after the resource's slot moved from %s to %s: %v", from.Addr, to.Addr, err)
	}
}

// TestRedisStoreReplicasSlotAsk: the same, halfway through a migration:
// the resource's keys were moved to the importing master while the slot
// is still the source's, which answers ASK; the script must be sent there
// after ASKING, on the same connection, and be confirmed by that master's
// replica. (Before evalSynced followed ASK: a raw "ASK" error.)
func TestRedisStoreReplicasSlotAsk(t *testing.T) {
	cl := redistest.StartClusterWithReplicas(t, 3, 1)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer c.Close()
	store := redisstore.Store{Client: c, Replicas: 1, ReplicaTimeout: 500 * time.Millisecond}
	const resource = "payment:1001"
	key := "fence:guard:{" + resource + "}"
	deadline := time.Now().Add(30 * time.Second)
	for { // the replicas may still be syncing
		err := store.Accept(ctx(t), resource, 10)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	slot, err := c.ClusterKeySlot(ctx(t), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	master, err := c.MasterForKey(ctx(t), key)
	if err != nil {
		t.Fatal(err)
	}
	var from, to *redistest.Server
	for _, s := range cl.Servers {
		if s.Addr == master.Options().Addr {
			from = s
		} else if to == nil {
			to = s
		}
	}
	src, dst := from.Client(t), to.Client(t)
	srcID, _ := src.ClusterMyID(ctx(t)).Result()
	dstID, _ := dst.ClusterMyID(ctx(t)).Result()
	for _, cmd := range [][]any{
		{"CLUSTER", "SETSLOT", slot, "IMPORTING", srcID},
		{"CLUSTER", "SETSLOT", slot, "MIGRATING", dstID},
	} {
		n := dst
		if cmd[3] == "MIGRATING" {
			n = src
		}
		if err := n.Do(ctx(t), cmd...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.Do(ctx(t), "MIGRATE", to.Host(), to.Port(), "", 0, 5000, "REPLACE", "KEYS", key, key+":call").Err(); err != nil {
		t.Fatal(err)
	}
	if err := store.Accept(ctx(t), resource, 11); err != nil {
		t.Fatalf("Accept with the resource's keys moved to the importing master: %v", err)
	}
	if err := store.Accept(ctx(t), resource, 9); !errors.Is(err, guard.ErrStale) {
		t.Fatalf("older token mid-migration: %v, want ErrStale", err)
	}
}

func fenceToken(n int64) fence.Token { return fence.Token(n) }
