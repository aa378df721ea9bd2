package redlock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// TestFailoverClientNodes: Redlock over three primaries, each behind its
// own Sentinels (a Sentinel failover client per node, as a user wanting
// nodes that survive a crash would set up). go-redis gives every failover
// client the address "FailoverClient", and New's duplicate check, which
// compares addresses, refused the three distinct nodes as one node given
// twice (before: "redlock: clients 0 and 1 reach the same server,
// FailoverClient").
func TestFailoverClientNodes(t *testing.T) {
	var clients []redis.UniversalClient
	for range 3 {
		primary := redistest.Start(t)
		s := redistest.StartSentinels(t, primary, 1)
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Master, SentinelAddrs: s.Addrs(), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	l, err := redlock.New(clients, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatalf("New on three failover clients of distinct primaries = %v", err)
	}
	lease, err := l.Acquire(ctxFor(t), "lock:failover-nodes", fence.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
}
