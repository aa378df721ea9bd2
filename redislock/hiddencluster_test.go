package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// cmdCounter is a go-redis hook that counts the commands a client sends
// whose arguments match accepts.
type cmdCounter struct {
	match func(args []any) bool
	n     atomic.Int64
}

// infoCounter counts the INFO commands with the cluster section: the
// question a Locker on an opaque client asks its server.
func infoCounter() *cmdCounter {
	return &cmdCounter{match: func(args []any) bool {
		return len(args) >= 2 && strings.EqualFold(fmt.Sprint(args[0]), "info") &&
			slices.ContainsFunc(args[1:], func(a any) bool { return strings.EqualFold(fmt.Sprint(a), "cluster") })
	}}
}

// nodesCounter counts CLUSTER NODES commands.
func nodesCounter() *cmdCounter {
	return &cmdCounter{match: func(args []any) bool {
		return len(args) >= 2 && strings.EqualFold(fmt.Sprint(args[0]), "cluster") && strings.EqualFold(fmt.Sprint(args[1]), "nodes")
	}}
}

func (h *cmdCounter) count(cmd redis.Cmder) {
	if h.match(cmd.Args()) {
		h.n.Add(1)
	}
}

func (h *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}

// TestHiddenClusterRefusal: a struct embedding the redis.UniversalClient
// interface around a *redis.ClusterClient (TestClusterBehindOtherUniversalClients)
// is refused at its first try with replica sync on: the Locker asks the
// server once (INFO cluster), finds a cluster node, and refuses with a
// *redislock.HiddenClusterError matching fence.ErrInvalidOption (and,
// from Acquire, fence.ErrNotAcquired) before the acquire script or the
// replica record's script runs: no lock, token, queue, waiter entry or
// replica record is written anywhere. A waiting Acquire ends at once, the
// refusal is kept (no second question), ReplicaSyncRefusal reports it, and
// ReplicaCounts, which would read another node's counts, is refused too.
// With sync off the wrapper still takes locks (the scripts route by key).
func TestHiddenClusterRefusal(t *testing.T) {
	t.Parallel() // own cluster; mostly waits for it to start
	cluster := redistest.StartClusterWithReplicas(t, 3, 1)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.ForEachShard(ctx(t), func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	probes := infoCounter()
	c.AddHook(probes)
	const name = "lock:payment:1001"

	l, err := redislock.New(interfaceWrapped{c}, nil)
	if err != nil {
		t.Fatalf("New on an interface wrapper = %v; New sends nothing, and takes it", err)
	}
	if err := l.ReplicaSyncRefusal(); err != nil {
		t.Errorf("ReplicaSyncRefusal before any try = %v; want nil (nothing asked yet)", err)
	}
	for i := range 2 {
		start := time.Now()
		lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute), fence.Wait(5*time.Second))
		took := time.Since(start)
		if err == nil {
			_ = lease.Release(ctx(t))
			t.Fatalf("Acquire %d on an interface wrapper of a cluster client, replica sync on: acquired", i)
		}
		var hidden *redislock.HiddenClusterError
		if !errors.As(err, &hidden) || !errors.Is(err, fence.ErrInvalidOption) || !errors.Is(err, fence.ErrNotAcquired) {
			t.Errorf("Acquire %d = %v; want a *redislock.HiddenClusterError matching fence.ErrInvalidOption and fence.ErrNotAcquired", i, err)
		} else if hidden.Client != "redislock_test.interfaceWrapped" || !strings.Contains(hidden.Detail, "Cluster node") || !strings.Contains(err.Error(), "pass the *redis.ClusterClient or *redis.Ring itself") {
			t.Errorf("Acquire %d: the refusal names %q and says %q; want the wrapper's type and what to pass instead", i, hidden.Client, err)
		}
		if took > time.Second {
			t.Errorf("Acquire %d with a 5 s wait budget refused after %v; want at once", i, took)
		}
	}
	if n := probes.n.Load(); n != 1 {
		t.Errorf("the server was asked whether it is a cluster node %d times over two Acquires; want once", n)
	}
	var hidden *redislock.HiddenClusterError
	if err := l.ReplicaSyncRefusal(); !errors.As(err, &hidden) || !errors.Is(err, fence.ErrInvalidOption) {
		t.Errorf("ReplicaSyncRefusal after the refusal = %v; want the *redislock.HiddenClusterError", err)
	}
	if _, err := l.ReplicaCounts(ctx(t), name); !errors.As(err, &hidden) {
		t.Errorf("ReplicaCounts on the interface wrapper = %v; want the *redislock.HiddenClusterError", err)
	}
	// Nothing taken or written: the lock's keys (all in its slot) and
	// the replica record, on every master.
	for _, key := range []string{lockKey(name), lockKey(name) + ":token", lockKey(name) + ":queue", lockKey(name) + ":waiters"} {
		if n, err := c.Exists(ctx(t), key).Result(); err != nil || n != 0 {
			t.Errorf("after the refusals %s exists (%d, %v); want nothing written", key, n, err)
		}
	}
	if err := c.ForEachMaster(ctx(t), func(ctx context.Context, m *redis.Client) error {
		if n, err := m.DBSize(ctx).Result(); err != nil || n != 0 {
			return fmt.Errorf("master %s holds %d keys (%v); want none", m.Options().Addr, n, err)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}

	off, err := redislock.New(interfaceWrapped{c}, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tryOnce(t, off, name); err != nil {
		t.Errorf("Acquire on the interface wrapper with replica sync off = %v; want it taken, as before", err)
	}
	if err := off.ReplicaSyncRefusal(); err != nil {
		t.Errorf("ReplicaSyncRefusal with replica sync off = %v; want nil", err)
	}
}

// TestInterfaceWrappedPlainClient: a struct embedding the
// redis.UniversalClient interface around a plain *redis.Client, on a
// primary with a replica, keeps replica sync: acquisitions are confirmed
// with the replica up and refused with fence.ErrNotReplicated with it
// paused. The Locker asks the server whether it is a cluster node once,
// however many Acquires run, concurrent first ones included.
func TestInterfaceWrappedPlainClient(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	c := primary.Client(t)
	probes := infoCounter()
	c.AddHook(probes)
	l := lockerWith(t, interfaceWrapped{c}, redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})

	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = tryOnce(t, l, fmt.Sprintf("lock:plain:%d", i)) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent first Acquire %d on an interface wrapper of a plain client = %v", i, err)
		}
	}
	for i := range 3 {
		if err := tryOnce(t, l, "lock:plain"); err != nil {
			t.Errorf("Acquire %d on an interface wrapper of a plain client = %v", i, err)
		}
	}
	refusedWhilePaused(t, l, replica, "lock:plain", "an interface wrapper of a plain client")
	if err := tryOnce(t, l, "lock:plain"); err != nil {
		t.Errorf("Acquire with the replica back = %v", err)
	}
	if n := probes.n.Load(); n != 1 {
		t.Errorf("the server was asked whether it is a cluster node %d times; want once per Locker", n)
	}
	if err := l.ReplicaSyncRefusal(); err != nil {
		t.Errorf("ReplicaSyncRefusal on a plain server = %v; want nil", err)
	}

	// A *redis.Client, or a struct embedding one, is known: not asked.
	probes.n.Store(0)
	for _, client := range []redis.UniversalClient{c, wrappedClient{c}} {
		if err := tryOnce(t, lockerWith(t, client, redislock.Options{}), "lock:plain"); err != nil {
			t.Errorf("Acquire on a %T = %v", client, err)
		}
	}
	if n := probes.n.Load(); n != 0 {
		t.Errorf("Lockers on a *redis.Client and a struct embedding one asked INFO cluster %d times; want none", n)
	}
}

// TestInterfaceWrappedRing: a struct embedding the redis.UniversalClient
// interface around a *redis.Ring hides the Ring as it hides a cluster
// client, and the Ring sends a pipelined key-less WAIT to the shard the
// command's name hashes to. A Ring's shards are standalone servers, so
// INFO cluster cannot tell: with the lock on the other shard and its
// replica paused, 10 of 10 acquisitions were confirmed. The probe now also
// runs a script on keys with random hash tags and counts the servers
// (run_ids) that answer: more than one, and every try is refused with a
// *redislock.HiddenClusterError, nothing taken.
func TestInterfaceWrappedRing(t *testing.T) {
	ring, shards := startRing(t, 1, 1)
	// The lock on the shard that a pipelined WAIT is not sent to (the
	// Ring hashes a key-less command's name).
	waits, err := ring.GetShardClientForKey("WAIT")
	if err != nil {
		t.Fatal(err)
	}
	lockShard := shards[0]
	if waits.Options().Addr == lockShard.primary.Addr {
		lockShard = shards[1]
	}
	name := nameOn(t, ring, lockShard, "hidden-ring")
	l := lockerWith(t, interfaceWrapped{ring}, redislock.Options{ReplicaSync: redislock.ReplicaSync{Timeout: 200 * time.Millisecond}})
	resume := lockShard.replicas[0].Pause(t)
	defer resume()
	confirmed := 0
	for i := range 10 {
		err := tryOnce(t, l, name)
		var hidden *redislock.HiddenClusterError
		if err == nil {
			confirmed++
		} else if !errors.As(err, &hidden) || !errors.Is(err, fence.ErrInvalidOption) || !errors.Is(err, fence.ErrNotAcquired) {
			t.Errorf("Acquire %d = %v; want a *redislock.HiddenClusterError", i, err)
		} else if !strings.Contains(hidden.Detail, "servers") {
			t.Errorf("Acquire %d: refused for %q; want the servers the keys reached", i, hidden.Detail)
		}
	}
	if confirmed > 0 {
		t.Errorf("%d of 10 acquisitions through an interface wrapper of a Ring confirmed with the lock shard's replica paused; want each refused", confirmed)
	}
	for _, s := range shards {
		if n, err := s.primary.Client(t).DBSize(ctx(t)).Result(); err != nil || n != 0 {
			t.Errorf("%s holds %d keys (%v) after the refusals; want none", s.name, n, err)
		}
	}
}
