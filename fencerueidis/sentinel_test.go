package fencerueidis_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// waitFor polls cond until it holds, failing the test after 30 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30 s")
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}

// TestSentinelFailover: on rueidis's Sentinel client, with every replica
// required to acknowledge, a watchdog lease survives the primary's death:
// the promoted replica has the lock, another Locker is refused there, the
// watchdog renews on the new primary, and the next token is larger.
func TestSentinelFailover(t *testing.T) {
	primary := redistest.Start(t)
	r1, r2 := redistest.StartReplica(t, primary), redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 2)
	sentinels := redistest.StartSentinels(t, primary, 3)
	redistest.WaitSentinelsReady(t, sentinels, 2)

	newClient := func() rueidis.Client {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: sentinels.Addrs(), Sentinel: rueidis.SentinelOption{MasterSet: sentinels.Master}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	sync := redislock.ReplicaSync{Acks: redislock.AcksAll}
	holder := newLocker(t, newClient(), redislock.Options{WatchdogTTL: 10 * time.Second, ReplicaSync: sync})
	other := newLocker(t, newClient(), redislock.Options{ReplicaSync: sync})
	lease, err := holder.Acquire(ctx(t), "lock:payment:1001") // watchdog lease
	if err != nil {
		t.Fatal(err)
	}

	primary.Kill()
	promoted := redistest.WaitFailover(t, sentinels, primary, r1, r2)
	t.Logf("sentinel promoted %s", promoted.Addr)
	if n := promoted.Client(t).Exists(ctx(t), lockKey("lock:payment:1001")).Val(); n != 1 {
		t.Fatal("the promoted replica does not have the lock")
	}
	waitFor(t, func() bool {
		_, err := other.Acquire(ctx(t), "lock:payment:1001")
		return errors.Is(err, fence.ErrHeld)
	})
	failedOver := time.Now()
	waitFor(t, func() bool { return lease.Deadline().After(failedOver.Add(5 * time.Second)) })
	if lease.Err() != nil {
		t.Fatalf("lease lost in the failover: %v", lease.Err())
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	next, err := other.Acquire(ctx(t), "lock:payment:1001", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= lease.Token() {
		t.Fatalf("token after failover %d, want > %d", next.Token(), lease.Token())
	}
	_ = next.Release(ctx(t))
}
