package guard_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
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

func fenceToken(n int64) fence.Token { return fence.Token(n) }
