package guard_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// tracedCluster wraps a cluster client the same way.
type tracedCluster struct{ *redis.ClusterClient }

// TestRedisStoreReplicasWrappedCluster: Replicas' doc says a client that
// does not pipeline on one connection is refused with
// fence.ErrInvalidOption. A wrapper embedding a *redis.ClusterClient has
// Pipeline, so it passed the check, and its cluster pipeline sends the
// key-less WAIT to any master: answered at once by a master whose replica
// runs, while the resource's master's replica was stopped. Accept returned
// nil for a token no replica had.
func TestRedisStoreReplicasWrappedCluster(t *testing.T) {
	cl := redistest.StartClusterWithReplicas(t, 3, 1)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	defer cc.Close()
	store := redisstore.Store{Client: tracedCluster{cc}, Replicas: 1, ReplicaTimeout: 200 * time.Millisecond}
	const resource = "payment:1001"
	master, err := cc.MasterForKey(ctx(t), "fence:guard:{"+resource+"}")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(master.Options().Addr, ":")
	var mine *redistest.Server
	for _, r := range cl.Replicas {
		info, err := r.Client(t).Info(ctx(t), "replication").Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(info, "master_port:"+port+"\r\n") {
			mine = r
		}
	}
	if mine == nil {
		t.Fatalf("no replica of %s", master.Options().Addr)
	}
	// A wrapped plain client is refused the same way (nothing can tell
	// the two wrappers apart), before anything reaches Redis; the
	// client's own *redis.Conn, one connection, is not.
	pc := master.Conn()
	defer pc.Close()
	for _, s := range []redisstore.Store{{Client: tracedClient{master}, Replicas: 1}, {Client: pc, Replicas: 1}} {
		err := s.Accept(ctx(t), resource, 5)
		if _, conn := s.Client.(*redis.Conn); conn != (err == nil) {
			t.Errorf("Replicas on a %T: %v", s.Client, err)
		}
	}
	resume := mine.Pause(t)
	defer resume()
	for i := range 6 {
		err := store.Accept(ctx(t), resource, fence.Token(10+i))
		if err == nil {
			t.Fatalf("try %d: Accept through a wrapped cluster client returned nil with the resource's master's replica stopped", i)
		}
		if !errors.Is(err, fence.ErrInvalidOption) && !errors.Is(err, fence.ErrNotReplicated) {
			t.Fatalf("try %d: %v, want fence.ErrInvalidOption (or ErrNotReplicated)", i, err)
		}
	}
}
