package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestSyncTimeoutLowHz: New fits the sync timeout in the client's read
// timeout with room for WAIT's lateness, one clock tick of the server, taken
// as 100 ms (hz 10, Redis's default). A server run with a lower hz (1,
// which redis.conf allows) answers a WAIT that timed out up to a second
// late, and the read times out first. Before: the client's i/o timeout,
// not fence.ErrNotReplicated, with the default sync timeout fitted to a
// read timeout of 400 ms (4 of 5), and the lock the script took was given
// back in the background, after Acquire returned. Now the script's reply
// was read and only WAIT's timed out: the take was not confirmed, so it is
// released before Acquire returns and refused as not replicated (Acked 0),
// wrapping the timeout.
func TestSyncTimeoutLowHz(t *testing.T) {
	primary := redistest.Start(t, "--hz", "1")
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	const rt = 400 * time.Millisecond
	c := redis.NewClient(&redis.Options{Addr: primary.Addr, ReadTimeout: rt, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1}})
	resume := replica.Pause(t)
	defer resume()
	var failed int
	for i := range 5 {
		start := time.Now()
		lease, err := l.Acquire(ctx(t), "lock:low-hz", fence.TTL(time.Minute))
		if err == nil {
			_ = lease.Release(ctx(t))
			t.Fatal("acquired with the replica paused")
		}
		if !errors.Is(err, fence.ErrNotReplicated) {
			failed++
			t.Logf("Acquire %d on a server with hz 1, read timeout %v, replica paused = %v after %v", i, rt, err, time.Since(start).Round(time.Millisecond))
		}
		lockGone(t, admin, "lock:low-hz", "after a refusal")
	}
	if failed > 0 {
		t.Errorf("%d of 5 Acquires with the replica paused did not give fence.ErrNotReplicated", failed)
	}
}

// TestSyncTimeoutLowHzPaths: the other paths that send WAIT, on a server
// with hz 1 and its replica paused. Each acquisition is refused as not
// replicated (or, where the caller's ctx ended first, with ctx's error),
// and its lock is not left held: at once when the script's reply was read,
// at the latest shortly after (given back in the background) when the call
// was given up on.
func TestSyncTimeoutLowHzPaths(t *testing.T) {
	primary := redistest.Start(t, "--hz", "1")
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	// The default sync timeout is then 50 ms: WAIT's reply, at the tick
	// after it, outlasts the read 85 times in 100; each case is tried
	// until one did (timedOut).
	const rt = 200 * time.Millisecond
	sync1 := redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1}}
	newClient := func(o redis.Options) *redis.Client {
		o.Addr = primary.Addr
		c := redis.NewClient(&o)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}

	// A renewal (Extend) whose WAIT's reply comes after the read timeout:
	// refused as not replicated, not the client's i/o timeout.
	t.Run("extend", func(t *testing.T) {
		l := lockerWith(t, newClient(redis.Options{ReadTimeout: rt, MaxRetries: -1}), sync1)
		lease, err := l.Acquire(ctx(t), "lock:low-hz:extend", fence.TTL(time.Minute))
		if err != nil {
			t.Fatalf("Acquire with the replica up = %v", err)
		}
		resume := replica.Pause(t)
		timedOut(t, rt, func(i int) {
			if err := lease.Extend(ctx(t), time.Minute); !errors.Is(err, fence.ErrNotReplicated) {
				t.Errorf("Extend %d with the replica paused = %v; want fence.ErrNotReplicated", i, err)
			}
		})
		resume()
		if err := lease.Release(ctx(t)); err != nil {
			t.Errorf("Release with the replica back = %v", err)
		}
	})

	resume := replica.Pause(t)
	defer resume()

	// Concurrent acquisitions of one Locker go in batches (batch.go),
	// with one WAIT after each batch.
	t.Run("batched", func(t *testing.T) {
		l := lockerWith(t, newClient(redis.Options{ReadTimeout: rt, MaxRetries: -1}), sync1)
		timedOut(t, rt, func(round int) {
			var wg sync.WaitGroup
			errs := make([]error, 6)
			for i := range errs {
				wg.Go(func() {
					lease, err := l.Acquire(ctx(t), fmt.Sprintf("lock:low-hz:batch:%d", i), fence.TTL(time.Minute))
					if err == nil {
						_ = lease.Release(ctx(t))
					}
					errs[i] = err
				})
			}
			wg.Wait()
			for i, err := range errs {
				if !errors.Is(err, fence.ErrNotReplicated) {
					t.Errorf("round %d: concurrent Acquire %d = %v; want fence.ErrNotReplicated", round, i, err)
				}
				lockGone(t, admin, fmt.Sprintf("lock:low-hz:batch:%d", i), "after a concurrent refusal")
			}
		})
	})

	// An Acquire with a wait budget tries again while the refusals are
	// transient, and ends with the last one when the budget ends. (It
	// passed before too: the i/o timeouts were transient, and retried.)
	t.Run("wait budget", func(t *testing.T) {
		l := lockerWith(t, newClient(redis.Options{ReadTimeout: rt, MaxRetries: -1}), sync1)
		timedOut(t, rt, func(i int) {
			lease, err := l.Acquire(ctx(t), "lock:low-hz:budget", fence.TTL(time.Minute), fence.Wait(time.Second))
			if err == nil {
				_ = lease.Release(ctx(t))
				t.Fatal("acquired with the replica paused")
			}
			if !errors.Is(err, fence.ErrNotReplicated) {
				t.Errorf("Acquire %d with a wait budget = %v; want fence.ErrNotReplicated", i, err)
			}
			// (A try given up on at the budget's end gives the lock
			// back when its reply comes.)
			waitFor(t, func() bool { return admin.Exists(ctx(t), lockKey("lock:low-hz:budget")).Val() == 0 })
		})
	})

	// go-redis sends the pipeline again after its read timed out
	// (MaxRetries): each copy's WAIT may time out the same way.
	t.Run("retries", func(t *testing.T) {
		l := lockerWith(t, newClient(redis.Options{ReadTimeout: rt, MaxRetries: 1}), sync1)
		timedOut(t, rt, func(i int) {
			if err := tryOnce(t, l, "lock:low-hz:retries"); !errors.Is(err, fence.ErrNotReplicated) {
				t.Errorf("Acquire %d on a client that resends = %v; want fence.ErrNotReplicated", i, err)
			}
			lockGone(t, admin, "lock:low-hz:retries", "after a refusal of a resent acquisition")
		})
	})

	// A client that puts ctx's deadline on its socket times the WAIT's
	// read out at that deadline: the take was not confirmed in time.
	t.Run("deadline on the socket", func(t *testing.T) {
		c := newClient(redis.Options{ReadTimeout: 2 * time.Second, MaxRetries: -1, ContextTimeoutEnabled: true})
		l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 300 * time.Millisecond}})
		cx, cancel := context.WithTimeout(ctx(t), 150*time.Millisecond)
		defer cancel()
		lease, err := l.Acquire(cx, "lock:low-hz:ctx", fence.TTL(time.Minute))
		if err == nil {
			_ = lease.Release(ctx(t))
			t.Fatal("acquired with the replica paused")
		}
		if !errors.Is(err, fence.ErrNotReplicated) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Acquire whose deadline ends during WAIT = %v; want fence.ErrNotReplicated and context.DeadlineExceeded", err)
		}
		lockGone(t, admin, "lock:low-hz:ctx", "after a refusal at the deadline")
	})

	// A client that does not: the Locker stops waiting at ctx's end,
	// whether or not the script's reply was read; the call's late end
	// gives the lock back.
	t.Run("ctx ends while waiting", func(t *testing.T) {
		l := lockerWith(t, newClient(redis.Options{ReadTimeout: 2 * time.Second, MaxRetries: -1}), redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 300 * time.Millisecond}})
		for _, wait := range []time.Duration{0, time.Second} {
			cx, cancel := context.WithTimeout(ctx(t), 150*time.Millisecond)
			lease, err := l.Acquire(cx, "lock:low-hz:leave", fence.TTL(time.Minute), fence.Wait(wait))
			cancel()
			if err == nil {
				_ = lease.Release(ctx(t))
				t.Fatal("acquired with the replica paused")
			}
			if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Acquire (wait %v) whose ctx ends during WAIT = %v; want fence.ErrNotAcquired and context.DeadlineExceeded", wait, err)
			}
			waitFor(t, func() bool { return admin.Exists(ctx(t), lockKey("lock:low-hz:leave")).Val() == 0 })
		}
	})
}

// timedOut runs try (numbered from 0) until one run took rt or more (a read
// timed out in it), at most 10 times.
func timedOut(t *testing.T, rt time.Duration, try func(i int)) {
	t.Helper()
	for i := range 10 {
		start := time.Now()
		try(i)
		if time.Since(start) >= rt {
			return
		}
	}
	t.Errorf("no run of 10 took the read timeout %v", rt)
}

// lockGone fails t if name's lock is held.
func lockGone(t *testing.T, admin *redis.Client, name, when string) {
	t.Helper()
	n, err := admin.Exists(ctx(t), lockKey(name)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		pttl := admin.PTTL(ctx(t), lockKey(name)).Val()
		t.Errorf("%s: %q still held (PTTL %v)", when, name, pttl)
	}
}
