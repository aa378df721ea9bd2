package redislock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestOpaqueClientWithoutShardedPubSub: a Locker on a client New cannot
// identify (a struct embedding redis.UniversalClient, as instrumentation
// wrappers are) publishes grants with both PUBLISH and SPUBLISH, and
// subscribes with both SUBSCRIBE and SSUBSCRIBE. An ACL user allowed the
// plain pub/sub commands and not the sharded ones (one written command by
// command before Redis 7, here +@all -spublish -ssubscribe) took and
// handed over locks through such a wrapper before: the release that grants
// to a waiter must still succeed, and the waiter get the lock.
func TestOpaqueClientWithoutShardedPubSub(t *testing.T) {
	srv := redistest.Start(t)
	if err := srv.Client(t).Do(ctx(t), "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-spublish", "-ssubscribe").Err(); err != nil {
		t.Fatal(err)
	}
	client := func() redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "app", Password: "pw"})
		t.Cleanup(func() { _ = c.Close() })
		return interfaceWrapped{c}
	}
	opts := redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}
	holderL, waiterL := lockerWith(t, client(), opts), lockerWith(t, client(), opts)
	const name = "lock:opaque-acl"
	held, err := holderL.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		lease, err := waiterL.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = lease.Release(ctx(t))
		}
		got <- err
	}()
	admin := srv.Client(t)
	deadline := time.Now().Add(10 * time.Second)
	for admin.Exists(ctx(t), "fence:{"+name+"}:queue").Val() == 0 { // the waiter queued
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue within 10 s")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	start := time.Now()
	relErr := held.Release(ctx(t))
	select {
	case err := <-got:
		if relErr != nil || err != nil {
			t.Fatalf("Release = %v; the waiter's Acquire and Release = %v (after %v)", relErr, err, time.Since(start))
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("Release = %v; the waiter was not given the lock within 15 s", relErr)
	}
}
