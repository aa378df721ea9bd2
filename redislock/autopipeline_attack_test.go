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

// interfaceWrapped is a user's UniversalClient that embeds the interface,
// not a concrete client (the usual shape of an instrumenting wrapper): it
// has no Options method, whatever it holds.
type interfaceWrapped struct{ redis.UniversalClient }

// TestClusterBehindOtherUniversalClients: New refuses a struct that embeds
// a *redis.ClusterClient (TestWrappedClusterClient), whose key-less WAIT
// the cluster client sends to a node of its choosing. Two other
// UniversalClients carry a cluster client the same way and have no Options
// method for New to see it by: go-redis's own AutoPipeliner
// (ClusterClient.AutoPipeline) and a struct embedding the
// redis.UniversalClient interface. Each must be refused by New, or give
// fence.ErrNotReplicated with the slot master's replica paused; an
// acquisition confirmed then is a lock a failover can lose. Before: 4 of 5
// (AutoPipeliner) and 3 of 5 (interface wrapper) confirmed. New now
// refuses an AutoPipeliner with replica sync on; New cannot tell the
// interface wrapper by its type, so its first synced try asks the server
// (INFO cluster), finds a cluster node, and every try is refused with a
// *redislock.HiddenClusterError (fence.ErrInvalidOption) before its
// script runs (TestHiddenClusterRefusal). With sync off an AutoPipeliner
// is accepted, as before.
func TestClusterBehindOtherUniversalClients(t *testing.T) {
	t.Parallel() // own cluster; mostly waits on it and the paused replica
	cluster := redistest.StartClusterWithReplicas(t, 3, 1)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { _ = c.Close() })
	const name = "lock:payment:1001"
	_, replica := masterAndReplica(t, cluster, c, name)
	ap, err := c.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ap.Close() })
	for _, w := range []struct {
		kind   string
		client redis.UniversalClient
	}{
		{"*redis.AutoPipeliner of a cluster client", ap},
		{"struct embedding redis.UniversalClient (a cluster client)", interfaceWrapped{c}},
	} {
		t.Run(w.kind, func(t *testing.T) {
			l, err := redislock.New(w.client, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})
			if errors.Is(err, fence.ErrInvalidOption) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			resume := replica.Pause(t)
			defer resume()
			confirmed := 0
			for i := range 5 {
				err := tryOnce(t, l, name)
				if err == nil {
					confirmed++
				} else if !errors.Is(err, fence.ErrNotReplicated) && !errors.Is(err, fence.ErrInvalidOption) {
					t.Errorf("Acquire %d = %v; want fence.ErrNotReplicated, or fence.ErrInvalidOption (a refusal)", i, err)
				}
			}
			if confirmed > 0 {
				t.Errorf("%s: %d of 5 acquisitions confirmed with the slot master's replica paused; want fence.ErrNotReplicated (or New's fence.ErrInvalidOption)", w.kind, confirmed)
			}
		})
	}
}

// TestAutoPipelinerSyncOff: with replica sync off New takes an
// AutoPipeliner, as before, and it acquires and releases.
func TestAutoPipelinerSyncOff(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ap, err := c.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ap.Close() })
	if _, err := redislock.New(ap, nil); !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("New on an AutoPipeliner, replica sync on = %v; want fence.ErrInvalidOption", err)
	}
	l, err := redislock.New(ap, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatalf("New on an AutoPipeliner, replica sync off = %v", err)
	}
	if err := tryOnce(t, l, "lock:ap"); err != nil {
		t.Fatal(err)
	}
}
