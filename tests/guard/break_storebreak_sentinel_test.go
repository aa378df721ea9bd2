package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestRedisStoreSentinelFailover: a Store with ClockTokens and Replicas on
// a Sentinel failover client. t7 is accepted (confirmed by both replicas),
// the primary is killed and a replica promoted by the sentinels: through
// the same client t5 is then a plain ErrStale (the record and the floor
// came over, nothing lost), and t9 is accepted once the new primary has
// its replica. Accepts during the failover return by their deadline.
func TestRedisStoreSentinelFailover(t *testing.T) {
	primary := redistest.Start(t)
	r1, r2 := redistest.StartReplica(t, primary), redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 2)
	sentinels := redistest.StartSentinels(t, primary, 3)
	redistest.WaitSentinelsReady(t, sentinels, 2)
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinels.Master, SentinelAddrs: sentinels.Addrs()})
	defer c.Close()
	store := clockStore(c)
	store.Replicas, store.ReplicaTimeout = 2, 500*time.Millisecond
	t5 := primeFloor(t, store, primary.Client(t))
	acceptThenStale(t, store, t5, t5+2)

	primary.Kill()
	// During the failover: an error (or a stale answer) by the deadline,
	// never an acceptance of t5.
	dctx, cancel := context.WithTimeout(context.Background(), time.Second)
	start := time.Now()
	err := store.Accept(dctx, "payment:1001", t5)
	cancel()
	if err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("t5 during the failover: %v after %v", err, time.Since(start))
	}
	promoted := redistest.WaitFailover(t, sentinels, primary, r1, r2)
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := store.Accept(ctx(t), "payment:1001", t5)
		if errors.Is(err, guard.ErrStale) && !errors.Is(err, guard.ErrStoreLost) {
			break
		}
		if err == nil || time.Now().After(deadline) {
			t.Fatalf("t5 after the failover to %s: %v, want a plain ErrStale", promoted.Addr, err)
		}
	}
	// One replica is left (the old primary is dead): Replicas 1.
	store.Replicas = 1
	for tok := t5 + 3; ; tok++ {
		err := store.Accept(ctx(t), "payment:1001", tok)
		if err == nil {
			break
		}
		if !errors.Is(err, fence.ErrNotReplicated) || time.Now().After(deadline) {
			t.Fatalf("token %d after the failover: %v", tok, err)
		}
	}
}
