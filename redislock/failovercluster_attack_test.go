package redislock_test

import (
	"errors"
	"os"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestFailoverClusterClientSync: redis.NewFailoverClusterClient is a
// *redis.ClusterClient over Sentinel-managed servers, which are not in
// cluster mode. New takes it for a cluster and accepts it with replica
// sync on (the default), and every Acquire then fails: "redislock: read
// replica counts: ERR This instance has cluster support disabled" (replica
// sync reads a cluster's replicas with CLUSTER NODES). With replica sync
// off the same client acquires, and its waiters are woken on release.
// New should refuse it with fence.ErrInvalidOption, or replica sync should
// count replicas with INFO replication on it; a ClusterClient's
// ClusterSlots (which NewFailoverClusterClient sets) also serves real
// clusters behind NAT, so telling the two apart at New, which sends
// nothing, is a design decision.
func TestFailoverClusterClientSync(t *testing.T) {
	if os.Getenv("FENCE_SHOW_BUGS") == "" {
		t.Skip("bug: New accepts a NewFailoverClusterClient with replica sync on, and every Acquire fails with 'read replica counts: ERR This instance has cluster support disabled'. FENCE_SHOW_BUGS=1 runs it.")
	}
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	s := redistest.StartSentinels(t, primary, 3)
	redistest.WaitSentinelsReady(t, s, 1)
	c := redis.NewFailoverClusterClient(&redis.FailoverOptions{MasterName: s.Master, SentinelAddrs: s.Addrs()})
	t.Cleanup(func() { _ = c.Close() })
	l, err := redislock.New(c, nil)
	if errors.Is(err, fence.ErrInvalidOption) {
		return // refused at New, with a reason
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := tryOnce(t, l, "lock:failover-cluster"); err != nil {
		t.Fatalf("Acquire with replica sync on a failover cluster client, replica up = %v", err)
	}
	resume := replica.Pause(t)
	defer resume()
	if err := tryOnce(t, l, "lock:failover-cluster"); !errors.Is(err, fence.ErrNotReplicated) {
		t.Errorf("Acquire with the replica paused = %v; want fence.ErrNotReplicated", err)
	}
}
