package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestSyncTimeoutWithinReadTimeout: WAIT's reply is read within the go-redis
// client's ReadTimeout. A client with a short read timeout (400 ms) and the
// default sync timeout (1 s), on a primary whose replica is paused, got the
// client's "i/o timeout" from Acquire, not fence.ErrNotReplicated: the read
// gave up before WAIT answered. The default now fits inside the read
// timeout with Redis's clock tick (WAIT answers up to 100 ms late), and a
// Timeout that does not is refused by New.
func TestSyncTimeoutWithinReadTimeout(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const rt = 400 * time.Millisecond
	client := redis.NewClient(&redis.Options{Addr: primary.Addr, ReadTimeout: rt, MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })

	for _, timeout := range []time.Duration{rt, rt - 100*time.Millisecond} {
		_, err := redislock.New(client, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: timeout}})
		if !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("New with a sync timeout of %v, read timeout %v = %v; want fence.ErrInvalidOption", timeout, rt, err)
		}
	}
	if _, err := redislock.New(client, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: rt - 150*time.Millisecond}}); err != nil {
		t.Errorf("New with a sync timeout of %v, read timeout %v = %v; want no error", rt-150*time.Millisecond, rt, err)
	}
	if _, err := redislock.New(client, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true, Timeout: time.Minute}}); err != nil {
		t.Errorf("New with sync disabled and a long sync timeout = %v; want no error", err)
	}

	l := lockerWith(t, client, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1}})
	refusedWhilePaused(t, l, replica, "lock:payment:1001", fmt.Sprintf("read timeout %v, default sync timeout", rt))
	lease, err := l.Acquire(ctx, "lock:payment:1001", fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire with the replica back = %v; the refused acquisition left the lock held?", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// refusedWhilePaused checks that l's Acquire of name, with replica paused,
// is refused with fence.ErrNotReplicated; what names the set-up.
func refusedWhilePaused(t *testing.T, l *redislock.Locker, replica *redistest.Server, name, what string) {
	t.Helper()
	resume := replica.Pause(t)
	defer resume()
	start := time.Now()
	lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	took := time.Since(start).Round(time.Millisecond)
	if err == nil {
		_ = lease.Release(ctx(t))
		t.Fatalf("%s: acquired with the replica paused", what)
	}
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Errorf("%s, replica paused: Acquire = %v after %v; want fence.ErrNotReplicated", what, err, took)
	}
}
