package redlock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// staleReplica cuts replica off from primary while it keeps answering, as
// redislock's test of the same name does: it can no longer authenticate
// to its primary and its link is killed, so it serves what it had.
func staleReplica(t *testing.T, primary, replica *redistest.Server) {
	t.Helper()
	admin, radmin := primary.Client(t), replica.Client(t)
	if err := radmin.ConfigSet(ctxFor(t), "masterauth", "wrong").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ClientKillByFilter(ctxFor(t), "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return strings.Contains(radmin.Info(ctxFor(t), "replication").Val(), "master_link_status:down") &&
			!strings.Contains(admin.Info(ctxFor(t), "replication").Val(), "port="+strings.Split(replica.Addr, ":")[1]+",")
	})
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		<-tick.C
	}
}

// TestStatusOnReplicaRoutingNode: a node given as a cluster client over a
// primary and its replica (as redis.NewFailoverClusterClient builds one, for
// a node that survives a crash) with ReadOnly or RouteRandomly sent
// Status's pipelined PTTL and GET, both read-only, to the replica. With the
// replica cut off from its primary, the lock that node had just granted was
// reported free with last token 0 on it ("{Held:false TTL:0s LastToken:0}"
// with ReadOnly; with RouteRandomly in most of 20 reads), as redislock's
// Status once did (TestStatusOnReplicaRoutingClient there). Status now
// reads both in a script, which go-redis sends to the primary.
func TestStatusOnReplicaRoutingNode(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	staleReplica(t, primary, replica)
	others := nodes(t, 2)
	for _, route := range []struct {
		name string
		set  func(*redis.ClusterOptions)
	}{
		{"ReadOnly", func(o *redis.ClusterOptions) { o.ReadOnly = true }},
		{"RouteRandomly", func(o *redis.ClusterOptions) { o.RouteRandomly = true }},
	} {
		t.Run(route.name, func(t *testing.T) {
			o := &redis.ClusterOptions{
				ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
					return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: primary.Addr}, {Addr: replica.Addr}}}}, nil
				},
				MaxRetries: -1,
			}
			route.set(o)
			cc := redis.NewClusterClient(o)
			t.Cleanup(func() { _ = cc.Close() })
			l, err := redlock.New(append([]redis.UniversalClient{cc}, clients(t, others)...), &redlock.Options{NodeTimeout: generous})
			if err != nil {
				t.Fatal(err)
			}
			name := "lock:status-route:" + route.name
			lease, err := l.Acquire(ctxFor(t), name, fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = lease.Release(ctxFor(t)) }()
			// The node granted it, or the next reads prove nothing.
			if n, err := primary.Client(t).Exists(ctxFor(t), lockKey(name)).Result(); err != nil || n != 1 {
				t.Fatalf("lock on the routed node's primary: %d, %v; want it there", n, err)
			}
			for i := range 20 {
				st, err := l.Status(ctxFor(t), name)
				if err != nil {
					t.Fatal(err)
				}
				if n := st[0]; n.Err != nil || !n.Held || n.TTL <= 0 || n.TTL > time.Minute || n.LastToken < lease.Token() {
					t.Fatalf("Status %d of the routed node = %+v; want held, token %d", i, n, lease.Token())
				}
			}
		})
	}
}
