package redislock_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestStaleWaitingTryRetriedByLocker: as TestStaleWaitingTryAfterRelease,
// but the client does not send the delayed try again (MaxRetries -1): its
// read times out and the waiting Acquire, seeing a transient error, sends
// the next try itself, with the same owner. That Acquire gets the lock,
// uses it and releases it; then the delayed try reaches Redis, finds the
// lock free and would take it for the owner of an Acquire that has
// returned, held by nobody for the lease time (a minute here). Another
// Acquire, waiting 3 s, must get the lock.
func TestStaleWaitingTryRetriedByLocker(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:stale-retry"
	lock := lockKey(name)
	opts := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	holder := acquire(t, lockerWith(t, srv.Client(t), opts), name, fence.TTL(time.Minute))
	tr := &transit{match: []byte(lock)}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: tr.dial, ReadTimeout: 300 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, opts)
	got := make(chan error, 1)
	go func() {
		ls, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(ctx(t))
		}
		got <- err
	}()
	entry := func(try string) func() bool {
		return func() bool {
			vals := admin.HVals(ctx(t), lock+":waiters").Val()
			return len(vals) == 1 && len(bytes.Fields([]byte(vals[0]))) > 1 && string(bytes.Fields([]byte(vals[0]))[1]) == try
		}
	}
	waitFor(t, entry("2")) // subscribed after its first try, it tried again
	tr.arm()
	if err := admin.Publish(ctx(t), lock+":released", "released").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, tr.holding)
	waitFor(t, entry("4")) // the Locker tried again after the read timed out
	if err := holder.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, admin, "evalsha")
	if err := tr.deliver(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return commandCalls(t, admin, "evalsha") > before })
	start := time.Now()
	ls, err := lockerWith(t, srv.Client(t), opts).Acquire(ctx(t), name, fence.Wait(3*time.Second), fence.TTL(time.Second))
	if err != nil {
		t.Fatalf("after the waiter released the lock and its delayed try ran: %v after %v; the lock is held for %v by %s", err, time.Since(start).Round(time.Millisecond), admin.PTTL(ctx(t), lock).Val(), admin.Get(ctx(t), lock).Val())
	}
	_ = ls.Release(ctx(t))
}
