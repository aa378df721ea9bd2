package redislock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestRefusedTakeUndoResentLate: a waiting Acquire's try takes the free
// lock and replica sync refuses it (the replica paused); its undo, an
// owner-checked release, is delayed on the network past the client's read
// timeout, and go-redis sends it again: the resend answers, the lock is
// deleted, and the wait goes on with the same owner. Once the replica is
// back, a later try takes the lock: a lease. Then the undo's first copy
// reaches Redis, finds the lock its owner's, and must not delete it under
// that lease.
func TestRefusedTakeUndoResentLate(t *testing.T) {
	srv := redistest.Start(t)
	replica := redistest.StartReplica(t, srv)
	redistest.WaitReplicated(t, srv, 1)
	admin := srv.Client(t)
	const name = "lock:refused-undo-resent"
	lock := lockKey(name)
	if err := acquire(t, lockerWith(t, srv.Client(t), redislock.Options{}), "lock:warm-up").Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	tr := &transit{match: fmt.Appendf(nil, "$1\r\n%d\r\n$%d\r\n%s\r\n", redislock.ReleaseKeys, len(lock), lock)}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: tr.dial, ReadTimeout: 300 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 100 * time.Millisecond}})
	if err := acquire(t, l, "lock:warm-up-l").Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	tr.arm()
	resume := replica.Pause(t)
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()
	got := make(chan acquired, 1)
	go func() {
		ls, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		got <- acquired{ls, err}
	}()
	waitFor(t, tr.holding) // the undo's first copy
	resume()
	resumed = true
	var r acquired
	select {
	case r = <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("Acquire has not returned 15 s after the replica is back")
	}
	if r.lease == nil {
		t.Logf("Acquire, its undo resent: %v", r.err)
		deliverLate(t, admin, tr)
		freeWithin(t, srv, admin, name, "after the Acquire gave up and its delayed undo ran")
		return
	}
	defer func() { _ = r.lease.Release(ctx(t)) }()
	owner := admin.Get(ctx(t), lock).Val()
	deliverLate(t, admin, tr)
	if now := admin.Get(ctx(t), lock).Val(); now != owner || r.lease.Err() != nil {
		t.Fatalf("the undo's first copy, delivered after a later try's lease (token %d), left the lock %q (was %q; lease Err %v): deleted under the lease",
			r.lease.Token(), now, owner, r.lease.Err())
	}
}
