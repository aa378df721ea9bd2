package redislock_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// TestExpiryKeptIsReplicated: a renewal or a repeated acquisition whose
// PEXPIRE GT moves nothing still writes to the replication stream, so that
// a WAIT after it covers every write before it on any Redis version:
// since 7.2 WAIT counts only its own connection's replicated writes, and a
// PEXPIRE GT that moves nothing is not replicated (a confirmation of a grant
// made in the same millisecond, or a shorter Extend after a longer one that
// the replicas did not acknowledge, was confirmed by nothing). The primary's replication offset
// must move across each; nothing else writes meanwhile (replica sync off:
// no WAIT, so no REPLCONF GETACK either).
func TestExpiryKeptIsReplicated(t *testing.T) {
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	c := primary.Client(t)
	const name = "lock:gt-kept"
	rec := &recordArgs{key: lockKey(name)}
	c.AddHook(rec)
	l := newLockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	lease := acquire(t, l, name, fence.TTL(2*time.Second))
	acquisition := rec.first()
	if acquisition == nil {
		t.Fatal("the acquisition's request was not seen")
	}
	if err := lease.Extend(ctx(t), time.Minute); err != nil {
		t.Fatal(err)
	}
	offset := func() int64 {
		t.Helper()
		info, err := admin.Info(ctx(t), "replication").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "master_repl_offset:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		t.Fatal("no master_repl_offset in INFO replication")
		return 0
	}
	before := offset()
	if err := lease.Extend(ctx(t), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if after := offset(); after == before {
		t.Errorf("a shorter Extend wrote nothing to the replication stream (offset %d): a WAIT after it confirms nothing", after)
	}
	before = offset()
	if err := admin.Do(ctx(t), acquisition...).Err(); err != nil {
		t.Fatal(err)
	}
	if after := offset(); after == before {
		t.Errorf("the acquisition repeated while the lock is held longer wrote nothing to the replication stream (offset %d): a WAIT after it confirms nothing", after)
	}
	if pttl := admin.PTTL(ctx(t), lockKey(name)).Val(); pttl < 30*time.Second {
		t.Errorf("PTTL %v after the shorter calls, want the minute's Extend kept", pttl)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}
