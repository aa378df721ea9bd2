package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestReleaseAsUserDeniedRename: an ACL user that lists its commands one
// by one, as written for versions before the released-by record (here
// +@all -rename), is refused the RENAME that a lease's release makes of
// the lock. Every Release failed with the script's permission error
// ("... The user executing the script can't run this command ...") and,
// as after any failed Release, the lock stayed held by nobody for the rest
// of its lease time (PTTL 59.99 s of a minute's lease), the waiter with
// it. The release deletes the lock then, without the record: only a
// Release sent again after its reply was lost is not covered, as before
// the record.
func TestReleaseAsUserDeniedRename(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	if err := admin.Do(ctx(t), "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-rename").Err(); err != nil {
		t.Fatal(err)
	}
	client := func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "app", Password: "pw"})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	opts := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	l, waiterL := lockerWith(t, client(), opts), lockerWith(t, client(), opts)
	const name = "lock:release-denied-rename"
	lease := acquire(t, l, name, fence.TTL(time.Minute))
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatalf("Release as a user denied RENAME = %v, want nil", err)
	}
	if ttl := admin.PTTL(ctx(t), lockKey(name)).Val(); ttl != -2*time.Nanosecond {
		t.Fatalf("the lock is still there after the Release (PTTL %v)", ttl)
	}
	// A release that grants the lock to a waiter, as that user.
	lease = acquire(t, l, name, fence.TTL(time.Minute))
	got := acquireAsync(waiterL, name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
	waitFor(t, func() bool { return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 })
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatalf("Release to a waiter, as a user denied RENAME = %v, want nil", err)
	}
	r := acquired{}.wait(t, got)
	if r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	}
	_ = r.lease.Release(context.Background())
}
