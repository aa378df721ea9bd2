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

// TestFailoverClusterClientSync: redis.NewFailoverClusterClient is a
// *redis.ClusterClient over Sentinel-managed servers, which are not in
// cluster mode: its ClusterSlots lists the primary and its replicas as one
// slot range. New took it for a cluster and accepted it with replica sync
// on (the default), and every Acquire then failed: "redislock: read
// replica counts: ERR This instance has cluster support disabled" (replica
// sync reads a cluster's replicas with CLUSTER NODES). It is now refused at
// the first try, typed (fence.ErrInvalidOption), with what to pass instead,
// before anything is written. New, which sends nothing, cannot tell it:
// a ClusterClient's ClusterSlots also serves real clusters behind NAT; the
// server's answer to CLUSTER NODES does.
//
// The client is built as NewFailoverClusterClient builds it, with
// ClusterSlots naming the primary and its replica, but without Sentinel:
// go-redis's Close of a NewFailoverClusterClient leaves its Sentinel
// goroutines running (goleak).
func TestFailoverClusterClientSync(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	c := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: primary.Addr}, {Addr: replica.Addr}}}}, nil
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	l, err := redislock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = tryOnce(t, l, "lock:failover-cluster")
	if !errors.Is(err, fence.ErrInvalidOption) || !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "NewFailoverClient") {
		t.Fatalf("Acquire with replica sync on a failover cluster client = %v, want ErrInvalidOption naming NewFailoverClient", err)
	}
	// A waiting Acquire ends at once: no try can do better.
	start := time.Now()
	if _, err := l.Acquire(ctx(t), "lock:failover-cluster", fence.Wait(5*time.Second)); !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("waiting Acquire = %v, want ErrInvalidOption", err)
	}
	if took := time.Since(start); took > 2500*time.Millisecond {
		t.Errorf("a waiting Acquire took %v of its 5s budget to be refused", took)
	}
	if n := primary.Client(t).DBSize(ctx(t)).Val(); n != 0 {
		t.Fatalf("refused, but %d keys written on the primary", n)
	}
	// With replica sync off the same client acquires.
	off, err := redislock.New(c, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tryOnce(t, off, "lock:failover-cluster"); err != nil {
		t.Fatalf("Acquire with replica sync off = %v", err)
	}
}
