package guard_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestRedisStoreWaitLateHz1: Replicas' doc says Redis answers WAIT up to a
// clock tick (100 ms) after its timeout, and Accept refuses a client whose
// ReadTimeout does not leave that room. On a server run with hz 1 a tick
// is a second: WAIT's answer comes after the read timeout, and go-redis
// sends the pipeline again (the refusal took 6 s for a 1 s ReplicaTimeout,
// undocumented before; now said in ReplicaTimeout's doc). The answer must
// still be a refusal (not replicated), within a few read timeouts.
func TestRedisStoreWaitLateHz1(t *testing.T) {
	srv := redistest.Start(t, "--hz", "1")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 1300 * time.Millisecond})
	defer c.Close()
	store := redisstore.Store{Client: c, Replicas: 1, ReplicaTimeout: time.Second, Prefix: "guardtest:hz1"}
	start := time.Now()
	err := store.Accept(ctx(t), "payment:1001", 5)
	took := time.Since(start)
	t.Logf("%v after %v", err, took)
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("no replica, hz 1: %v, want fence.ErrNotReplicated", err)
	}
	if took > 15*time.Second {
		t.Fatalf("refusal took %v", took)
	}
}
