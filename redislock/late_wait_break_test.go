package redislock_test

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestLateWaitIsLate: with replica sync, the acquire script takes the lock
// at once but its replica is stopped, so WAIT is answered only once the
// replica is back, after the lease time (within WAIT's timeout, with the
// acknowledgement: not a refusal). The take is late all the same: no
// lease, ErrNotAcquired saying the reply came too late, the lock given
// back (free at once, not held for its lease time), the owner revoked.
func TestLateWaitIsLate(t *testing.T) {
	const name, ttl = "lock:late-wait", 300 * time.Millisecond
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	c := redis.NewClient(&redis.Options{Addr: primary.Addr, ReadTimeout: 6 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 5 * time.Second}})
	if err := acquire(t, l, "lock:warm-up").Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	replica.Signal(syscall.SIGSTOP)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			replica.Signal(syscall.SIGCONT)
		}
	})
	got := acquireAsync(l, name, fence.TTL(ttl))
	waitFor(t, func() bool { return admin.Exists(ctx(t), lockKey(name)).Val() == 1 }) // taken; WAIT pending
	probe, err := lockerWith(t, primary.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}).Acquire(ctx(t), name+":probe", fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	<-probe.Done()
	replica.Signal(syscall.SIGCONT)
	resumed = true
	r := acquired{}.wait(t, got)
	if r.lease != nil {
		t.Fatalf("Acquire whose WAIT was answered past the deadline returned a lease, deadline %v ago, Err %v", time.Since(r.lease.Deadline()).Round(time.Millisecond), r.lease.Err())
	}
	if !errors.Is(r.err, fence.ErrNotAcquired) || !strings.Contains(r.err.Error(), "too late") || errors.Is(r.err, fence.ErrNotReplicated) {
		t.Fatalf("Acquire = %v, want ErrNotAcquired saying the reply came too late", r.err)
	}
	t.Logf("Acquire: %v", r.err)
	if holder, pttl := admin.Get(ctx(t), lockKey(name)).Val(), admin.PTTL(ctx(t), lockKey(name)).Val(); holder != "" {
		t.Errorf("the late take's lock is still held by %s for %v", holder, pttl)
	}
	if n := len(admin.Keys(ctx(t), lockKey(name)+":revoked:*").Val()); n != 1 {
		t.Errorf("%d revocation marks, want 1", n)
	}
}
