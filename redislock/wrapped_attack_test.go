package redislock_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// wrappedClient and wrappedCluster are a user's own UniversalClient: a
// go-redis client embedded in a struct (to add methods, instrumentation,
// a name), as New accepts any UniversalClient.
type wrappedClient struct{ *redis.Client }

type wrappedCluster struct{ *redis.ClusterClient }

// TestWrappedClientShortReadTimeout: the sync timeout is fitted to the
// client's ReadTimeout (TestSyncTimeoutWithinReadTimeout), read from its
// options, but only when the client is a *redis.Client: a struct embedding
// one, with ReadTimeout 400 ms, got the default 1 s, and the Acquire with
// a replica paused returned the client's i/o timeout, not
// fence.ErrNotReplicated (before: "redislock: read tcp ...: i/o timeout
// after 807ms"; New accepted a sync timeout of 1 s).
func TestWrappedClientShortReadTimeout(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	const rt = 400 * time.Millisecond
	c := redis.NewClient(&redis.Options{Addr: primary.Addr, ReadTimeout: rt, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	w := wrappedClient{c}

	if _, err := redislock.New(w, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: time.Second}}); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("New on a wrapped client, sync timeout 1 s, read timeout %v = %v; want fence.ErrInvalidOption", rt, err)
	}
	l, err := redislock.New(w, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1}})
	if err != nil {
		t.Fatal(err)
	}
	refusedWhilePaused(t, l, replica, "lock:wrapped", fmt.Sprintf("a wrapped client (read timeout %v)", rt))
}

// TestWrappedClusterClient: a struct embedding a *redis.ClusterClient is
// not seen as a cluster: replica sync pipelines the key-less WAIT through
// it, and the cluster client sends WAIT to a node of its choosing, not on
// the connection that ran the script, where it counts nothing that
// connection wrote. Before: with the replica paused, acquisitions 1, 2 and
// 4 of 5 were confirmed (Acquire = <nil>). New now refuses the wrapper.
func TestWrappedClusterClient(t *testing.T) {
	t.Parallel() // own cluster; mostly waits on it and the paused replica
	cluster := redistest.StartClusterWithReplicas(t, 3, 1)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { _ = c.Close() })
	const name = "lock:payment:1001"
	_, replica := masterAndReplica(t, cluster, c, name)

	l, err := redislock.New(wrappedCluster{c}, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})
	if errors.Is(err, fence.ErrInvalidOption) {
		return // refused: the caller is told to pass the cluster client itself
	}
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := tryOnce(t, l, name); err != nil {
			t.Fatalf("Acquire %d on a wrapped cluster client, replicas up = %v", i, err)
		}
	}
	resume := replica.Pause(t)
	defer resume()
	for i := range 5 {
		err := tryOnce(t, l, name)
		if !errors.Is(err, fence.ErrNotReplicated) {
			t.Errorf("Acquire %d on a wrapped cluster client, the slot master's replica paused = %v; want fence.ErrNotReplicated (or New's fence.ErrInvalidOption)", i, err)
		}
	}
}

type wrappedRing struct{ *redis.Ring }

// TestWrappedRingRefused: a struct embedding a *redis.Ring would carry
// replica sync's key-less WAIT through the Ring, which sends it to a shard
// of its own choosing (see primaryFor): New refuses it, as it refuses a
// wrapped cluster client.
func TestWrappedRingRefused(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = ring.Close() })
	if _, err := redislock.New(wrappedRing{ring}, nil); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("New on a wrapped Ring = %v; want fence.ErrInvalidOption", err)
	}
	if _, err := redislock.New(ring, nil); err != nil {
		t.Errorf("New on the Ring itself = %v; want no error", err)
	}
}
