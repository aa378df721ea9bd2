package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// ringShard is one shard of a test Ring: a primary and its replicas.
type ringShard struct {
	name     string
	primary  *redistest.Server
	replicas []*redistest.Server
}

// startRing starts one primary per entry of replicas, with that many
// replicas each, and a Ring over them.
func startRing(t *testing.T, replicas ...int) (*redis.Ring, []*ringShard) {
	t.Helper()
	addrs := make(map[string]string)
	var shards []*ringShard
	for i, n := range replicas {
		s := &ringShard{name: fmt.Sprintf("shard%d", i), primary: redistest.Start(t)}
		for range n {
			s.replicas = append(s.replicas, redistest.StartReplica(t, s.primary))
		}
		redistest.WaitReplicated(t, s.primary, n)
		addrs[s.name] = s.primary.Addr
		shards = append(shards, s)
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: addrs})
	t.Cleanup(func() { _ = ring.Close() })
	return ring, shards
}

// nameOn returns a lock name (starting with base) whose keys the Ring puts
// on shard s.
func nameOn(t *testing.T, ring *redis.Ring, s *ringShard, base string) string {
	t.Helper()
	for i := range 10000 {
		name := fmt.Sprintf("%s-%d", base, i)
		c, err := ring.GetShardClientForKey("fence:{" + name + "}")
		if err != nil {
			t.Fatal(err)
		}
		if c.Options().Addr == s.primary.Addr {
			return name
		}
	}
	t.Fatalf("no lock name maps to %s", s.name)
	return ""
}

// TestRingSyncOnLockShard: on a Ring of several primaries, replica sync
// must confirm an acquisition or renewal with the replicas of the shard
// that holds the lock, and count (and record) that shard's replicas: not
// those of the shard a key-less WAIT, or the key of the replica record,
// would be routed to. Shard 0 has one replica, shard 1 two, shard 2 none.
// For each shard: with its replicas running, Acquire succeeds and the
// counts and the record on that shard are its own; with them paused, an
// Acquire and an Extend on it are refused (fence.ErrNotReplicated), while
// the replicas of the other shards run.
func TestRingSyncOnLockShard(t *testing.T) {
	t.Parallel() // own shards; mostly waits on WAITs
	ring, shards := startRing(t, 1, 2, 0)
	l := lockerWith(t, ring, redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 300 * time.Millisecond}})
	for _, s := range shards {
		want := len(s.replicas)
		name := nameOn(t, ring, s, "ring-sync")
		lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
		if err != nil {
			t.Fatalf("%s (%d replicas, running): Acquire(%q) = %v; want a lease", s.name, want, name, err)
		}
		r, err := l.ReplicaCounts(ctx(t), name)
		if err != nil {
			t.Fatal(err)
		}
		if r.Expected != want || r.Connected != want {
			t.Errorf("%s: ReplicaCounts = %+v; want %d expected and connected", s.name, r, want)
		}
		st, err := l.Status(ctx(t), name)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Held || st.LastToken != lease.Token() || st.Replicas.Connected != want {
			t.Errorf("%s: Status = %+v; want held with token %d, %d replicas", s.name, st, lease.Token(), want)
		}
		if want > 0 {
			rec, err := s.primary.Client(t).Get(ctx(t), replicaRecord).Result()
			if err != nil || !strings.HasSuffix(rec, fmt.Sprintf(" %d", want)) {
				t.Errorf("%s: replica record on the lock's shard = %q, %v; want its count %d", s.name, rec, err, want)
			}
		}
		if want > 0 {
			// SetExpectedReplicas writes the lock shard's record, and no
			// other shard's.
			records := func() []string {
				var recs []string
				for _, o := range shards {
					rec, _ := o.primary.Client(t).Get(ctx(t), replicaRecord).Result()
					recs = append(recs, rec)
				}
				return recs
			}
			before := records()
			if err := l.SetExpectedReplicas(ctx(t), name, want+1); err != nil {
				t.Fatal(err)
			}
			after := records()
			for i, o := range shards {
				if o == s && !strings.HasSuffix(after[i], fmt.Sprintf(" %d", want+1)) {
					t.Errorf("%s: record after SetExpectedReplicas(%d) = %q", s.name, want+1, after[i])
				}
				if o != s && after[i] != before[i] {
					t.Errorf("SetExpectedReplicas on %s changed %s's record from %q to %q", s.name, o.name, before[i], after[i])
				}
			}
			if r, err := l.ReplicaCounts(ctx(t), name); err != nil || r.Expected != want+1 {
				t.Errorf("%s: ReplicaCounts after SetExpectedReplicas(%d) = %+v, %v", s.name, want+1, r, err)
			}
			if err := l.SetExpectedReplicas(ctx(t), name, want); err != nil {
				t.Fatal(err)
			}
		}
		if want == 0 {
			if err := lease.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
			continue
		}

		for _, r := range s.replicas {
			r.Signal(syscall.SIGSTOP)
		}
		err = lease.Extend(ctx(t), time.Minute)
		if !errors.Is(err, fence.ErrNotReplicated) {
			t.Errorf("%s: Extend with the lock shard's replicas paused = %v; want fence.ErrNotReplicated", s.name, err)
		}
		other := nameOn(t, ring, s, "ring-paused")
		if lease2, err := l.Acquire(ctx(t), other, fence.TTL(time.Minute)); !errors.Is(err, fence.ErrNotReplicated) {
			t.Errorf("%s: Acquire(%q) with the lock shard's replicas paused = %v; want fence.ErrNotReplicated", s.name, other, err)
			if err == nil {
				_ = lease2.Release(ctx(t))
			}
		}
		for _, r := range s.replicas {
			r.Signal(syscall.SIGCONT)
		}
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRingSyncWaitShardWithoutReplica: a Ring of two primaries, one with
// a replica and one without, named so that the Ring routes a key-less
// command (WAIT) to the one without and the replica record's key to the
// one with. A lock on the shard with the replica must be taken while its
// replica runs, and refused while it is paused; a lock on the shard
// without replicas is taken with no WAIT.
func TestRingSyncWaitShardWithoutReplica(t *testing.T) {
	bare, withReplica := ringNames(t)
	primary, other := redistest.Start(t), redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{withReplica: primary.Addr, bare: other.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	s := &ringShard{name: withReplica, primary: primary, replicas: []*redistest.Server{replica}}
	l := lockerWith(t, ring, redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 300 * time.Millisecond}})

	name := nameOn(t, ring, s, "ring-wait")
	for i := range 3 {
		if err := tryOnce(t, l, name); err != nil {
			t.Fatalf("Acquire %d on the shard with a running replica = %v; want a lease", i, err)
		}
	}
	replica.Signal(syscall.SIGSTOP)
	err := tryOnce(t, l, name)
	replica.Signal(syscall.SIGCONT)
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Errorf("Acquire with the lock shard's replica paused = %v; want fence.ErrNotReplicated", err)
	}
	bareName := nameOn(t, ring, &ringShard{name: bare, primary: other}, "ring-bare")
	if err := tryOnce(t, l, bareName); err != nil {
		t.Errorf("Acquire on the shard without replicas = %v; want a lease", err)
	}
}

// ringNames returns two shard names, bare and withReplica, such that a
// Ring of the two routes a key-less pipelined command (go-redis hashes
// its name, "WAIT") to bare and the key of the replica record to
// withReplica. The Ring is never used to connect: the addresses are
// closed ports, and it is asked only where keys go.
func ringNames(t *testing.T) (bare, withReplica string) {
	t.Helper()
	for i := range 100 {
		a, b := fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i)
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{a: "127.0.0.1:1", b: "127.0.0.1:2"}})
		w, err1 := ring.GetShardClientForKey("WAIT")
		r, err2 := ring.GetShardClientForKey(replicaRecord)
		_ = ring.Close()
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if w.Options().Addr != r.Options().Addr {
			if w.Options().Addr == "127.0.0.1:1" {
				return a, b
			}
			return b, a
		}
	}
	t.Fatal("no pair of shard names splits WAIT from the replica record")
	return "", ""
}

// TestRingConformance runs the conformance suite on a Ring of two
// primaries, each with a replica, with replica sync on (discovering the
// counts): each Locker has a Ring of its own, as each process would.
func TestRingConformance(t *testing.T) {
	t.Parallel() // own shards; the suite mostly waits on leases and budgets (1 s slack)
	_, shards := startRing(t, 1, 1)
	addrs := map[string]string{}
	for _, s := range shards {
		addrs[s.name] = s.primary.Addr
	}
	newRing := func(t testing.TB) *redis.Ring {
		r := redis.NewRing(&redis.RingOptions{Addrs: addrs})
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	admin := newRing(t)
	fencetest.Run(t, fencetest.Config{
		// A take answered past its deadline gives no lease (MinTTL leaves
		// 7.9 ms): Acquire may refuse a lease of MinTTL.
		ShortLeaseMayFail: true,
		New: func(t testing.TB) fence.Locker {
			return newLockerWith(t, newRing(t), redislock.Options{WatchdogTTL: conformanceWatchdogTTL})
		},
		Remove:      func(t testing.TB, name string) { admin.Del(context.Background(), lockKey(name)) },
		WatchdogTTL: conformanceWatchdogTTL,
	})
}
