package redislock_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestSyncTimeoutLowHz: New fits the sync timeout in the client's read
// timeout with room for WAIT's lateness, one clock tick of the server, taken
// as 100 ms (hz 10, Redis's default). A server run with a lower hz (1,
// which redis.conf allows) answers a WAIT that timed out up to a second
// late, and the read times out first: the client's i/o timeout, not
// fence.ErrNotReplicated, with the default sync timeout fitted to a
// read timeout of 400 ms.
func TestSyncTimeoutLowHz(t *testing.T) {
	if os.Getenv("FENCE_SHOW_BUGS") == "" {
		t.Skip("bug: redislock's WAIT tick allowance (100 ms) assumes hz 10; on a server with hz 1 a lagging replica gives the client's i/o timeout, not ErrNotReplicated. New sends nothing, so it cannot read hz: a design decision. FENCE_SHOW_BUGS=1 runs it.")
	}
	primary := redistest.Start(t, "--hz", "1")
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	const rt = 400 * time.Millisecond
	c := redis.NewClient(&redis.Options{Addr: primary.Addr, ReadTimeout: rt, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1}})
	resume := replica.Pause(t)
	defer resume()
	var failed int
	for i := range 5 {
		start := time.Now()
		lease, err := l.Acquire(ctx(t), "lock:low-hz", fence.TTL(time.Minute))
		if err == nil {
			_ = lease.Release(ctx(t))
			t.Fatal("acquired with the replica paused")
		}
		if !errors.Is(err, fence.ErrNotReplicated) {
			failed++
			t.Logf("Acquire %d on a server with hz 1, read timeout %v, replica paused = %v after %v", i, rt, err, time.Since(start).Round(time.Millisecond))
		}
	}
	if failed > 0 {
		t.Errorf("%d of 5 Acquires with the replica paused did not give fence.ErrNotReplicated", failed)
	}
}
