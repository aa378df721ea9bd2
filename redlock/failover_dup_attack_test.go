package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// TestFailoverClientsOfOneMaster: two Sentinel failover clients of the
// same master (one Sentinel URL listed twice in a configuration) are one
// server given twice. Since ca1b923 New no longer compares failover
// clients (go-redis gives every one the address "FailoverClient", which
// refused distinct primaries), so it takes them as two nodes; before, it
// refused them (by that shared address). That must not make one server a
// majority: the lock's key can be set once on it, so with the third node
// down the second client of the same master finds the key held, and
// Acquire fails (1 of 3). What is lost is only the fault tolerance the
// user counted on (3 nodes that are 2).
func TestFailoverClientsOfOneMaster(t *testing.T) {
	primary := redistest.Start(t)
	s := redistest.StartSentinels(t, primary, 1)
	var clients []redis.UniversalClient
	for range 2 {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Master, SentinelAddrs: s.Addrs(), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	down := redistest.Start(t)
	third := redis.NewClient(&redis.Options{Addr: down.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = third.Close() })
	down.Kill()
	clients = append(clients, third)

	l, err := redlock.New(clients, &redlock.Options{NodeTimeout: generous})
	if errors.Is(err, fence.ErrInvalidOption) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	lease, err := l.Acquire(ctxFor(t), "lock:one-master-twice", fence.TTL(10*time.Second))
	if err == nil {
		_ = lease.Release(ctxFor(t))
		t.Fatalf("two failover clients of one master, third node down: Acquire granted a majority by one server")
	}
	t.Logf("Acquire = %v", err)
}
