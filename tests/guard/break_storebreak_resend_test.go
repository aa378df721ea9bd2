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

// TestRedisStoreReplicasResendConfirmsNothing: with Replicas, the
// pipeline (script + WAIT) whose reply is lost after the script ran is
// sent again by go-redis on a fresh connection. The script finds its own
// call and writes nothing, and WAIT counts only its own connection's
// writes: had a fresh connection's WAIT counted every connected replica,
// a paused (SIGSTOPped) one included, Accept would confirm a token no
// replica had. Redis 7.0 answers such a WAIT with the replicas that have
// the primary's whole stream (checked by hand: a fresh connection's GET +
// WAIT 1 gives 0 with the replica paused behind), so it held; this keeps
// it so.
func TestRedisStoreReplicasResendConfirmsNothing(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	d := redistest.NewDropper("{payment:1001}")
	c := redis.NewClient(&redis.Options{Addr: primary.Addr, Dialer: d.Dial})
	defer c.Close()
	store := redisstore.Store{Client: c, Replicas: 1, ReplicaTimeout: 300 * time.Millisecond,
		Prefix: "guardtest:resend"}
	// The script cached, a pooled connection warm, the replica in sync.
	if err := store.Accept(ctx(t), "warm", 1); err != nil {
		t.Fatal(err)
	}
	resume := replica.Pause(t)
	defer resume()
	d.Arm()
	err := store.Accept(ctx(t), "payment:1001", 5)
	if d.Dropped() != 1 {
		t.Fatalf("%d replies dropped, want 1: the test did not test a resend", d.Dropped())
	}
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("Accept resent by go-redis with the only replica paused: %v, want fence.ErrNotReplicated", err)
	}
}
