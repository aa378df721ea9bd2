package redislock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestFailoverClusterRefusalKept: a failover cluster client is refused
// at its first synced try (TestFailoverClusterClientSync), but the
// refusal was not kept: every later Acquire asked the servers again (INFO
// and CLUSTER NODES, a round trip: 6 over 6 Acquires), and
// ReplicaSyncRefusal, "the error every try that needs a WAIT gets", said
// nil after the refusals. Now the first refusal is kept, as a hidden
// cluster's is: asked once, and ReplicaSyncRefusal reports it. With
// ReplicaSync.Replicas given nothing reads CLUSTER NODES, and replica sync
// works (the script and WAIT go to the slot master's own client): taken
// with the replica up, fence.ErrNotReplicated with it paused.
func TestFailoverClusterRefusalKept(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	nodes := nodesCounter()
	c := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: primary.Addr}, {Addr: replica.Addr}}}}, nil
		},
		NewClient: func(o *redis.Options) *redis.Client {
			n := redis.NewClient(o)
			n.AddHook(nodes)
			return n
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{})
	for i := range 5 {
		if err := tryOnce(t, l, "lock:fc"); !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), "NewFailoverClient") {
			t.Fatalf("Acquire %d = %v; want ErrInvalidOption naming NewFailoverClient", i, err)
		}
	}
	start := time.Now()
	if _, err := l.Acquire(ctx(t), "lock:fc", fence.Wait(5*time.Second)); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("waiting Acquire = %v; want ErrInvalidOption", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("a waiting Acquire refused after %v; want at once", took)
	}
	if n := nodes.n.Load(); n != 1 {
		t.Errorf("CLUSTER NODES sent %d times over 6 refused Acquires; want once (the refusal kept)", n)
	}
	if err := l.ReplicaSyncRefusal(); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("ReplicaSyncRefusal after the refusals = %v; want the refusal (fence.ErrInvalidOption)", err)
	}
	if _, err := l.ReplicaCounts(ctx(t), "lock:fc"); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("ReplicaCounts = %v; want fence.ErrInvalidOption", err)
	}
	if n := primary.Client(t).DBSize(ctx(t)).Val(); n != 0 {
		t.Errorf("refused, but %d keys on the primary", n)
	}

	given := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 200 * time.Millisecond}})
	if err := tryOnce(t, given, "lock:fc"); err != nil {
		t.Errorf("Replicas 1: Acquire = %v; want it taken", err)
	}
	refusedWhilePaused(t, given, replica, "lock:fc", "a failover cluster client, Replicas 1")
	if err := given.ReplicaSyncRefusal(); err != nil {
		t.Errorf("Replicas 1: ReplicaSyncRefusal = %v; want nil", err)
	}
}
