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

// TestSyncShortTimeoutRefusal: a client whose ReadTimeout is no more than
// WAIT's clock tick (100 ms) leaves room for no WAIT: Redis answers even a
// WAIT of 1 ms up to a tick late. The default sync timeout on such a
// client was 1 ms, and an Acquire with a replica paused got, now and then,
// the client's i/o timeout, not fence.ErrNotReplicated (read timeout 50 ms:
// "i/o timeout after 100ms", one run in three). Such a Locker now refuses
// every try that needs a WAIT with fence.ErrInvalidOption, before the
// script runs (New takes the client: on a primary without replicas no WAIT
// is sent, see TestShortReadTimeoutNoReplicas).
//
// A short sync timeout given on a client with room (1 ms, read timeout
// 5 s) gives fence.ErrNotReplicated, and the refused acquisition gives its
// lock back. That release was given the sync timeout as its budget, 1 ms,
// less than a round trip: it always failed ("release after failed sync:
// ... context deadline exceeded"), and the lock was left to a background
// retry, still there when Acquire returned.
func TestSyncShortTimeoutRefusal(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)

	for _, rt := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 101 * time.Millisecond} {
		client := redis.NewClient(&redis.Options{Addr: primary.Addr, ReadTimeout: rt, MaxRetries: -1})
		t.Cleanup(func() { _ = client.Close() })
		l, err := redislock.New(client, nil)
		if err != nil {
			t.Fatalf("New with the default sync timeout, read timeout %v = %v", rt, err)
		}
		start := time.Now()
		if _, err := l.Acquire(ctx(t), "lock:no-room", fence.Wait(time.Second)); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("Acquire with a replica, the default sync timeout, read timeout %v = %v; want fence.ErrInvalidOption", rt, err)
		} else if took := time.Since(start); took > 500*time.Millisecond {
			t.Errorf("Acquire with no room for WAIT refused after %v, want at once (not retried through the wait)", took)
		}
		if n, err := admin.Exists(ctx(t), "fence:{lock:no-room}").Result(); err != nil || n != 0 {
			t.Errorf("a try refused for no room for WAIT left the lock (%d, %v)", n, err)
		}
		if _, err := redislock.New(client, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}}); err != nil {
			t.Errorf("New with sync off, read timeout %v = %v; want no error", rt, err)
		}
	}
	fits := redis.NewClient(&redis.Options{Addr: primary.Addr, ReadTimeout: 102 * time.Millisecond})
	t.Cleanup(func() { _ = fits.Close() })
	if _, err := redislock.New(fits, nil); err != nil {
		t.Errorf("New with the default sync timeout, read timeout 102ms = %v; want no error", err)
	}

	client := redis.NewClient(&redis.Options{Addr: primary.Addr})
	t.Cleanup(func() { _ = client.Close() })
	l, err := redislock.New(client, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	const name = "lock:short-sync"
	for i := range 3 {
		resume := replica.Pause(t)
		start := time.Now()
		lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
		took := time.Since(start).Round(time.Millisecond)
		gone := admin.Exists(ctx(t), lockKey(name)).Val() == 0
		resume()
		if err == nil {
			_ = lease.Release(ctx(t))
			t.Fatalf("acquired with the replica paused")
		}
		if !errors.Is(err, fence.ErrNotReplicated) {
			t.Errorf("Acquire %d, sync timeout 1ms, replica paused = %v after %v; want fence.ErrNotReplicated", i, err, took)
		}
		if strings.Contains(err.Error(), "release after failed sync") || !gone {
			t.Errorf("Acquire %d, sync timeout 1ms: the refused acquisition did not give its lock back (key gone: %v): %v", i, gone, err)
		}
		waitFor(t, func() bool { return admin.Exists(ctx(t), lockKey(name)).Val() == 0 })
	}
}
