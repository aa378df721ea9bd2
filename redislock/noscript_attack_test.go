package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// beforeEval runs f (once armed) before the first pipeline that carries a
// script in full (EVAL): the one sent again after NOSCRIPT, once the first
// pipeline's WAIT has answered.
type beforeEval struct {
	mu    sync.Mutex
	armed bool
	f     func()
	waits []int64 // the timeouts of the WAITs sent with EVAL
}

func (h *beforeEval) arm(f func()) {
	h.mu.Lock()
	h.armed, h.f = true, f
	h.mu.Unlock()
}

func (h *beforeEval) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *beforeEval) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *beforeEval) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		eval := false
		var ms int64 = -1
		for _, cmd := range cmds {
			switch a := cmd.Args(); strings.ToLower(fmt.Sprint(a[0])) {
			case "eval":
				eval = true
			case "wait":
				ms = a[2].(int64)
			}
		}
		if eval {
			h.mu.Lock()
			f := h.f
			if !h.armed {
				f = nil
			}
			h.armed = false
			if ms >= 0 {
				h.waits = append(h.waits, ms)
			}
			h.mu.Unlock()
			if f != nil {
				f()
			}
		}
		return next(ctx, cmds)
	}
}

// TestNoScriptResentWaitCountsItsOwn: the first pipeline's WAIT answers at
// once (the replica has everything the connection wrote before), then the
// replica stops before the script is sent again in full. The WAIT sent
// with it, with what is left of the timeout, must count the replicas that
// have the new write: none. The acquisition is refused and the lock given
// back, and a renewal refused, never confirmed by the first WAIT's count.
func TestNoScriptResentWaitCountsItsOwn(t *testing.T) {
	t.Parallel() // own servers; mostly waits out WAIT timeouts
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	c := primary.Client(t)
	h := &beforeEval{}
	c.AddHook(h)
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 300 * time.Millisecond}})
	warm := acquire(t, l, "lock:warm", fence.TTL(time.Minute)) // scripts cached; the connection's writes acknowledged
	if err := warm.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	flush := func() {
		if err := admin.ScriptFlush(ctx(t)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var resume func()
	pause := func() { resume = replica.Pause(t) }

	flush()
	h.arm(pause)
	const name = "lock:noscript-paused"
	_, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("Acquire with the replica stopped before the script was sent again = %v, want ErrNotReplicated", err)
	}
	if resume == nil {
		t.Fatal("the script was not sent again in full: the test did not test NOSCRIPT")
	}
	if n, err := admin.Exists(ctx(t), lockKey(name)).Result(); err != nil || n != 0 {
		t.Fatalf("after the refused acquisition the lock key exists (%d, %v): not given back", n, err)
	}
	resume()
	redistest.WaitReplicated(t, primary, 1)

	// Renewal: the lease taken with the scripts cached, then flushed.
	lease := acquire(t, l, "lock:noscript-extend", fence.TTL(time.Minute))
	flush()
	resume = nil
	h.arm(pause)
	err = lease.Extend(ctx(t), time.Minute)
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("Extend with the replica stopped before the script was sent again = %v, want ErrNotReplicated", err)
	}
	if resume == nil {
		t.Fatal("the extension was not sent again in full: the test did not test NOSCRIPT")
	}
	resume()
	h.mu.Lock()
	t.Logf("WAIT timeouts (ms) sent again with EVAL: %v", h.waits)
	h.mu.Unlock()
}

// TestNoScriptAfterBusyServer: the server is held (CLIENT PAUSE, as a busy
// server or a slow round trip would) for longer than the sync timeout
// while the first pipeline (EVALSHA refused with NOSCRIPT, and its WAIT)
// waits; its WAIT then counts the replica at once. The replica stalls for
// well under the timeout just as the script is sent again in full (stopped
// 150 ms, timeout 400 ms): a healthy replica, briefly slow. The WAIT sent
// with the script must not be left with only the rest of a timeout that
// the busy server, not the replica, used up: the acquisition is
// confirmed, as it is with the scripts cached.
func TestNoScriptAfterBusyServer(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	pauser := primary.Client(t)
	c := primary.Client(t)
	h := &beforeEval{}
	c.AddHook(h)
	const (
		timeout = 400 * time.Millisecond
		stall   = 150 * time.Millisecond
	)
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: timeout}})
	warm := acquire(t, l, "lock:warm", fence.TTL(time.Minute))
	if err := warm.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		redistest.WaitReplicated(t, primary, 1)
		if err := admin.ScriptFlush(ctx(t)).Err(); err != nil {
			t.Fatal(err)
		}
		redistest.WaitReplicated(t, primary, 1)
		if err := pauser.Do(ctx(t), "CLIENT", "PAUSE", (2 * timeout).Milliseconds(), "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		var resumed sync.WaitGroup
		h.arm(func() {
			resume := replica.Pause(t)
			resumed.Add(1)
			time.AfterFunc(stall, func() { resume(); resumed.Done() }) // the replica's stall
		})
		start := time.Now()
		name := fmt.Sprintf("lock:busy:%d", i)
		lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
		took := time.Since(start)
		resumed.Wait()
		if err != nil {
			h.mu.Lock()
			t.Fatalf("round %d: Acquire = %v after %v, want the lease (the replica stalled %v of a %v timeout); WAIT timeouts (ms) sent with EVAL: %v", i, err, took, stall, timeout, h.waits)
		}
		t.Logf("round %d: acquired in %v", i, took)
		if err := lease.Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	h.mu.Lock()
	t.Logf("WAIT timeouts (ms) sent again with EVAL: %v", h.waits)
	h.mu.Unlock()
}

// TestClusterNoScriptResentWait: both halves above on a cluster, where the
// script and its WAIT go to the lock's master through its node client: the
// replica stopped as EVAL goes out refuses the acquisition; the master held
// past the timeout with the replica stalled 150 ms of 400 ms as EVAL goes
// out confirms it.
func TestClusterNoScriptResentWait(t *testing.T) {
	cluster := redistest.StartClusterWithReplicas(t, 3, 1)
	h := &beforeEval{}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { _ = c.Close() })
	c.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
	const name = "lock:payment:1001"
	master, replica := masterAndReplica(t, cluster, c, name)
	noScriptResentWait(t, c, h, master, replica, name)
}

// TestRingNoScriptResentWait: the same on a Ring, where they go to the
// lock's shard through its shard client.
func TestRingNoScriptResentWait(t *testing.T) {
	ring, shards := startRing(t, 1, 1)
	h := &beforeEval{}
	if err := ring.ForEachShard(ctx(t), func(_ context.Context, n *redis.Client) error { n.AddHook(h); return nil }); err != nil {
		t.Fatal(err)
	}
	name := nameOn(t, ring, shards[0], "lock:ring-noscript")
	noScriptResentWait(t, ring, h, shards[0].primary, shards[0].replicas[0], name)
}

// noScriptResentWait runs the two halves of the tests above on c, whose
// script calls on name go to master (replicated by replica) through a
// client with the hook h.
func noScriptResentWait(t *testing.T, c redis.UniversalClient, h *beforeEval, master, replica *redistest.Server, name string) {
	t.Helper()
	const (
		timeout = 400 * time.Millisecond
		stall   = 150 * time.Millisecond
	)
	admin := master.Client(t).Conn() // one connection: WAIT counts its own writes
	t.Cleanup(func() { _ = admin.Close() })
	pauser := master.Client(t)
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: timeout}})
	lease := acquire(t, l, name, fence.TTL(time.Minute)) // the scripts cached
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	flush := func() { // and wait for the replica to have it (WAIT on admin's own connection)
		if err := admin.ScriptFlush(ctx(t)).Err(); err != nil {
			t.Fatal(err)
		}
		if n, err := admin.Do(ctx(t), "WAIT", 1, 10000).Int(); err != nil || n != 1 {
			t.Fatalf("WAIT after SCRIPT FLUSH = %d, %v", n, err)
		}
	}

	flush()
	var resume func()
	h.arm(func() { resume = replica.Pause(t) })
	_, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if resume == nil {
		t.Fatalf("the script was not sent again in full (Acquire = %v): the test did not test NOSCRIPT", err)
	}
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("Acquire with the replica stopped before the script was sent again = %v, want ErrNotReplicated", err)
	}
	if n, err := admin.Exists(ctx(t), lockKey(name)).Result(); err != nil || n != 0 {
		t.Fatalf("after the refused acquisition the lock key exists (%d, %v): not given back", n, err)
	}
	resume()

	flush()
	if err := pauser.Do(ctx(t), "CLIENT", "PAUSE", (2 * timeout).Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	var resumed sync.WaitGroup
	resumed.Add(1)
	h.arm(func() {
		resume := replica.Pause(t)
		time.AfterFunc(stall, func() { resume(); resumed.Done() }) // the replica's stall
	})
	start := time.Now()
	lease, err = l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	took := time.Since(start)
	h.mu.Lock()
	armed := h.armed
	h.armed = false
	h.mu.Unlock()
	if armed {
		t.Fatal("the script was not sent again in full")
	}
	resumed.Wait()
	if err != nil {
		t.Fatalf("Acquire = %v after %v, want the lease (the replica stalled %v of a %v timeout)", err, took, stall, timeout)
	}
	t.Logf("acquired in %v", took)
	_ = lease.Release(ctx(t))
}
