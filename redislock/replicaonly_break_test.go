package redislock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestReplicaOnlyFailoverClient: a Sentinel client with ReplicaOnly sends
// every command to a replica. New cannot tell it from any other Sentinel
// client (go-redis keeps ReplicaOnly inside its dialer; New sends
// nothing), and accepts it. Its Acquire failed with the replica's bare
// "READONLY You can't write against a read only replica. script: …" (a
// waiting one after retrying it for its whole budget, as it retries a
// failover under way), and its Status, before Status read by script,
// read the replica's copy of the lock, which may be behind (a lock just
// taken reported free: TestStatusOnReplicaRoutingClient). Now the error says
// that the command reached a replica and names ReplicaOnly, and Status
// fails (state.lua refuses to read on a replica) rather than answer for the
// primary.
func TestReplicaOnlyFailoverClient(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	sentinels := redistest.StartSentinels(t, primary, 1)
	redistest.WaitSentinelsReady(t, sentinels, 1)
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinels.Master, SentinelAddrs: sentinels.Addrs(), ReplicaOnly: true})
	t.Cleanup(func() { _ = c.Close() })
	const name = "lock:replica-only"
	held := acquire(t, newLocker(t, primary.Client(t)), name, fence.TTL(time.Minute))
	for _, sync := range []redislock.ReplicaSync{{}, {Disabled: true}} {
		l := newLockerWith(t, c, redislock.Options{ReplicaSync: sync})
		_, err := l.Acquire(ctx(t), "lock:replica-only:free", fence.TTL(time.Minute))
		if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "READONLY") || !strings.Contains(err.Error(), "ReplicaOnly") {
			t.Errorf("sync %+v: Acquire = %v; want READONLY, naming ReplicaOnly", sync, err)
		}
		// A waiting Acquire retries READONLY, as it does through a
		// failover, and ends with the same explanation.
		_, err = l.Acquire(ctx(t), "lock:replica-only:free", fence.TTL(time.Minute), fence.Wait(300*time.Millisecond))
		if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "READONLY") || !strings.Contains(err.Error(), "ReplicaOnly") {
			t.Errorf("sync %+v: waiting Acquire = %v; want READONLY, naming ReplicaOnly", sync, err)
		}
		st, err := l.Status(ctx(t), name)
		if err == nil || !strings.Contains(err.Error(), "READONLY") || !strings.Contains(err.Error(), "ReplicaOnly") {
			t.Errorf("sync %+v: Status of a lock held with token %d = %+v, %v; want READONLY, naming ReplicaOnly", sync, held.Token(), st, err)
		}
	}
}
