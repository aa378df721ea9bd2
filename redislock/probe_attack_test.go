package redislock_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestHiddenRingGrows: the opaque-client probe's answer is kept for the
// Locker's life. A struct embedding the redis.UniversalClient interface
// around a *redis.Ring of one shard passes it (one server), and the Ring
// then gets a second shard (Ring.SetAddrs, as a deployment that grows
// does): the lock names on the new shard go there, the pipelined key-less
// WAIT goes to the shard the Ring hashes the command's name to, and an
// acquisition on a shard whose replica is paused must be refused
// (fence.ErrNotReplicated or the *redislock.HiddenClusterError), never
// confirmed. Before: the one-server answer was kept for the Locker's life,
// and 5 of 10 were confirmed (those on the shard the WAIT did not go to).
// Now an answer of one server is asked again when it is 10 s old, as the
// expected replica count is re-read: the Locker's clock is moved on by that
// after the Ring grows. Within those 10 s the old answer still holds (see
// HiddenClusterError).
func TestHiddenRingGrows(t *testing.T) {
	var shards []*ringShard
	for i := range 2 {
		s := &ringShard{name: []string{"shard0", "shard1"}[i], primary: redistest.Start(t)}
		s.replicas = append(s.replicas, redistest.StartReplica(t, s.primary))
		redistest.WaitReplicated(t, s.primary, 1)
		shards = append(shards, s)
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"shard0": shards[0].primary.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	l := lockerWith(t, interfaceWrapped{ring}, redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})
	if err := tryOnce(t, l, "lock:grow"); err != nil {
		t.Fatalf("Acquire on a one-shard Ring behind an interface = %v; want it taken (one server)", err)
	}
	var ahead atomic.Int64
	redislock.SetClock(l, func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) })
	ring.SetAddrs(map[string]string{"shard0": shards[0].primary.Addr, "shard1": shards[1].primary.Addr})
	ahead.Store(int64(10 * time.Second))
	nameOn(t, ring, shards[1], "grow") // the Ring now uses both
	confirmed := 0
	for _, s := range shards {
		name := nameOn(t, ring, s, "grow")
		resume := s.replicas[0].Pause(t)
		for i := range 5 {
			err := tryOnce(t, l, name)
			var hidden *redislock.HiddenClusterError
			switch {
			case err == nil:
				confirmed++
			case errors.Is(err, fence.ErrNotReplicated), errors.As(err, &hidden):
			default:
				t.Errorf("%s, Acquire %d = %v; want fence.ErrNotReplicated or a *redislock.HiddenClusterError", s.name, i, err)
			}
		}
		resume()
	}
	if confirmed > 0 {
		t.Errorf("%d of 10 acquisitions through an interface wrapper of a Ring that grew to two shards confirmed with the lock shard's replica paused; want each refused", confirmed)
	}
}
