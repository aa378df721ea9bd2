package redislock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestNewAcceptsGoRedisDefaults: New fits the replica sync timeout to the
// client's read timeout and refuses what does not fit. Every client a user
// gets from go-redis with its defaults, or with the read timeouts go-redis
// documents (0: the default, -1: none, -2: no deadline set at all), with
// ContextTimeoutEnabled, from NewUniversalClient and from the URL parsers,
// must still be accepted with replica sync on, as it was before.
func TestNewAcceptsGoRedisDefaults(t *testing.T) {
	const addr = "127.0.0.1:1" // New sends nothing
	url := func(q string) *redis.Options {
		o, err := redis.ParseURL("redis://" + addr + q)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	clusterURL := func(q string) *redis.ClusterOptions {
		o, err := redis.ParseClusterURL("redis://" + addr + q)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	clients := map[string]redis.UniversalClient{}
	for _, rt := range []time.Duration{0, -1, -2, 3 * time.Second, 103 * time.Millisecond} {
		clients["Client ReadTimeout "+rt.String()] = redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: rt})
		clients["Client ContextTimeoutEnabled ReadTimeout "+rt.String()] = redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: rt, ContextTimeoutEnabled: true})
		clients["ClusterClient ReadTimeout "+rt.String()] = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ReadTimeout: rt})
		clients["Ring ReadTimeout "+rt.String()] = redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, ReadTimeout: rt})
		clients["FailoverClient ReadTimeout "+rt.String()] = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{addr}, ReadTimeout: rt})
		clients["FailoverClusterClient ReadTimeout "+rt.String()] = redis.NewFailoverClusterClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{addr}, ReadTimeout: rt})
	}
	clients["NewUniversalClient one address"] = redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}})
	clients["NewUniversalClient two addresses"] = redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr, "127.0.0.1:2"}})
	clients["NewUniversalClient MasterName"] = redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}, MasterName: "m"})
	clients["NewUniversalClient IsClusterMode"] = redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}, IsClusterMode: true})
	for _, q := range []string{"", "?read_timeout=-1", "?read_timeout=-2", "?read_timeout=0", "?read_timeout=3s", "?read_timeout=200ms"} {
		clients["ParseURL "+q] = redis.NewClient(url(q))
		clients["ParseClusterURL "+q] = redis.NewClusterClient(clusterURL(q))
	}
	for kind, c := range clients {
		t.Cleanup(func() { _ = c.Close() })
		if _, err := redislock.New(c, nil); err != nil {
			t.Errorf("New(%s (%T), nil) = %v; want a Locker", kind, c, err)
		}
	}
}

// TestShortReadTimeoutNoReplicas: a primary without replicas, and a client
// with a read timeout of 100 ms (a latency-sensitive service's setting).
// Replica sync is on by default and "costs nothing on a primary without
// replicas": no WAIT is sent. Before c2e7736 New took the client and every
// Acquire succeeded; c2e7736 made New refuse it with ErrInvalidOption
// (unless the caller turned replica sync off, which on a primary that
// gains a replica later leaves it off). The refusal now comes at the first
// try that needs a WAIT (TestSyncShortTimeoutRefusal).
func TestShortReadTimeoutNoReplicas(t *testing.T) {
	srv := redistest.Start(t)
	for _, rt := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond} {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: rt})
		t.Cleanup(func() { _ = c.Close() })
		l, err := redislock.New(c, nil)
		if errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("New, read timeout %v, on a primary without replicas = %v; want a Locker (no WAIT is sent)", rt, err)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := tryOnce(t, l, "lock:short-rt"); err != nil {
			t.Errorf("Acquire, read timeout %v, no replicas = %v", rt, err)
		}
	}
}
