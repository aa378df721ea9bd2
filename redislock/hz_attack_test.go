package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
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
	// newClient returns a client with o, and a hook of its own counting
	// its WAITs that timed out.
	newClient := func(o redis.Options) (*redis.Client, *waitTimeouts) {
		o.Addr = primary.Addr
		c := redis.NewClient(&o)
		t.Cleanup(func() { _ = c.Close() })
		waits := &waitTimeouts{}
		c.AddHook(waits)
		return c, waits
	}

	// A renewal (Extend) whose WAIT's reply comes after the read timeout:
	// refused as not replicated, not the client's i/o timeout.
	t.Run("extend", func(t *testing.T) {
		c, waits := newClient(redis.Options{ReadTimeout: rt, MaxRetries: -1})
		l := lockerWith(t, c, sync1)
		lease, err := l.Acquire(ctx(t), "lock:low-hz:extend", fence.TTL(time.Minute))
		if err != nil {
			t.Fatalf("Acquire with the replica up = %v", err)
		}
		resume := replica.Pause(t)
		timedOut(t, waits, func(i int) {
			if err := lease.Extend(ctx(t), time.Minute); !errors.Is(err, fence.ErrNotReplicated) {
				t.Errorf("Extend %d with the replica paused = %v; want fence.ErrNotReplicated", i, err)
			}
		})
		resume()
		if err := lease.Release(ctx(t)); err != nil {
			t.Errorf("Release with the replica back = %v", err)
		}
	})

	// A Release while an Acquire of the same Locker waits sends WAIT with
	// the release script (the handoff); its reply coming after the read
	// timeout changes nothing of the release's outcome (see the package
	// doc): Release returns nil (it released).
	t.Run("release handoff", func(t *testing.T) {
		// Any command wakes the server, which then times the WAIT out
		// at once: the waiter, holding its grant back while the
		// release is in flight for up to twice the sync timeout, then
		// confirms it. A sync timeout of 190 ms lets the read of 300 ms
		// time out first.
		c, waits := newClient(redis.Options{ReadTimeout: 300 * time.Millisecond, MaxRetries: -1})
		l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 190 * time.Millisecond}})
		slow := false
		for i := 0; i < 10 && !slow; i++ {
			name := fmt.Sprintf("lock:low-hz:handoff:%d", i)
			lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
			if err != nil {
				t.Fatalf("Acquire with the replica up = %v", err)
			}
			waited := make(chan error, 1)
			go func() {
				// (A budget longer than the lease: a grant of it is
				// one the Release's WAIT may cover.)
				lease, err := l.Acquire(ctx(t), name, fence.TTL(500*time.Millisecond), fence.Wait(2*time.Second))
				if err == nil {
					_ = lease.Release(ctx(t))
				}
				waited <- err
			}()
			// Queued and subscribed: the Release hands the lock on.
			waitFor(t, func() bool {
				subs := admin.PubSubNumSub(ctx(t), lockKey(name)+":released").Val()
				return admin.Exists(ctx(t), lockKey(name)+":queue").Val() == 1 && subs[lockKey(name)+":released"] == 1
			})
			resume := replica.Pause(t)
			before := waits.n.Load()
			if err := lease.Release(ctx(t)); err != nil {
				t.Errorf("Release %d with a waiter, the replica paused = %v; want nil (it released)", i, err)
			}
			slow = waits.n.Load() > before
			resume()
			<-waited // taken once the replica is back, or not: either way
		}
		if !slow {
			t.Error("no Release of 10 had its WAIT's read time out")
		}
	})

	resume := replica.Pause(t)
	defer resume()

	// Concurrent acquisitions of one Locker go in batches (batch.go),
	// with one WAIT after each batch.
	t.Run("batched", func(t *testing.T) {
		c, waits := newClient(redis.Options{ReadTimeout: rt, MaxRetries: -1})
		l := lockerWith(t, c, sync1)
		timedOut(t, waits, func(round int) {
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
	// transient, and ends with the last one when the budget ends (before:
	// the client's i/o timeout when the last try's WAIT timed out).
	t.Run("wait budget", func(t *testing.T) {
		c, waits := newClient(redis.Options{ReadTimeout: rt, MaxRetries: -1})
		l := lockerWith(t, c, sync1)
		timedOut(t, waits, func(i int) {
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
		c, waits := newClient(redis.Options{ReadTimeout: rt, MaxRetries: 1})
		l := lockerWith(t, c, sync1)
		timedOut(t, waits, func(i int) {
			if err := tryOnce(t, l, "lock:low-hz:retries"); !errors.Is(err, fence.ErrNotReplicated) {
				t.Errorf("Acquire %d on a client that resends = %v; want fence.ErrNotReplicated", i, err)
			}
			lockGone(t, admin, "lock:low-hz:retries", "after a refusal of a resent acquisition")
		})
	})

	// A client that puts ctx's deadline on its socket times the WAIT's
	// read out at that deadline: the take was not confirmed in time.
	t.Run("deadline on the socket", func(t *testing.T) {
		c, _ := newClient(redis.Options{ReadTimeout: 2 * time.Second, MaxRetries: -1, ContextTimeoutEnabled: true})
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
		c, _ := newClient(redis.Options{ReadTimeout: 2 * time.Second, MaxRetries: -1})
		l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 300 * time.Millisecond}})
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

// timedOut runs try (numbered from 0) until a WAIT's read timed out in a
// run, at most 10 times.
func timedOut(t *testing.T, waits *waitTimeouts, try func(i int)) {
	t.Helper()
	for i := range 10 {
		before := waits.n.Load()
		try(i)
		if waits.n.Load() > before {
			return
		}
	}
	t.Error("no run of 10 had a WAIT's read time out")
}

// waitTimeouts is a hook that counts the WAITs, in pipelines, whose read
// timed out.
type waitTimeouts struct{ n atomic.Int64 }

func (h *waitTimeouts) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *waitTimeouts) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *waitTimeouts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			var ne net.Error
			if cmd.Name() == "wait" && errors.As(cmd.Err(), &ne) && ne.Timeout() {
				h.n.Add(1)
			}
		}
		return err
	}
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
