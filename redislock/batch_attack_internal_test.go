package redislock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// batchState is a condition on l's batcher, read under its lock.
func batchState(l *Locker, f func(b *batcher) bool) func() bool {
	return func() bool {
		l.batch.mu.Lock()
		defer l.batch.mu.Unlock()
		return f(&l.batch)
	}
}

// errPipelineHook is what failPipelines returns.
var errPipelineHook = errors.New("hook: pipelines refused")

// failPipelines is a client hook that refuses every pipeline of script
// calls without sending it (a circuit breaker, a rate limiter), and lets
// single commands through.
type failPipelines struct{}

func (failPipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (failPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (failPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if isScript(cmd) {
				return errPipelineHook
			}
		}
		return next(ctx, cmds)
	}
}

// TestBatchHookErrorReachesCaller: a client hook that refuses pipelines
// fails a batch without sending it; each caller in it gets the hook's
// error, as a call straight through gets its ProcessHook's, not a reply
// that was never read.
func TestBatchHookErrorReachesCaller(t *testing.T) {
	srv := redistest.Start(t)
	c := patientClient(t, redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	c.AddHook(failPipelines{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, "warm", fence.TTL(time.Minute)) // straight through
	if err != nil {
		t.Fatal(err)
	}
	_ = lease.Release(ctx)
	resume := srv.Pause(t)
	direct := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, "lock:hook:direct", fence.TTL(time.Minute))
		direct <- err
	}()
	eventually(t, batchState(l, func(b *batcher) bool { return b.inflight == 1 }))
	// The direct slot is busy: these go in batches, which the hook fails.
	for _, wait := range []time.Duration{0, time.Second} {
		lease, err := l.Acquire(ctx, "lock:hook:batched", fence.TTL(time.Minute), fence.Wait(wait))
		t.Logf("batched Acquire (wait %v): %v", wait, err)
		if err == nil {
			_ = lease.Release(ctx)
			t.Fatalf("batched Acquire succeeded through a hook that refuses pipelines")
		}
		if !errors.Is(err, errPipelineHook) {
			t.Errorf("batched Acquire (wait %v) = %v; want the hook's error", wait, err)
		}
	}
	resume()
	if err := <-direct; err != nil {
		t.Fatalf("direct Acquire: %v", err)
	}
}

// TestSyncedHookErrorReachesCaller: with replica sync, a call straight
// through goes as a pipeline (the script and WAIT); a hook that refuses it
// gives the caller its error too.
func TestSyncedHookErrorReachesCaller(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	c.AddHook(failPipelines{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(c, &Options{ReplicaSync: ReplicaSync{Replicas: 1}})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, "lock:hook:synced", fence.TTL(time.Minute))
	if err == nil {
		_ = lease.Release(ctx)
		t.Fatal("Acquire succeeded through a hook that refuses pipelines")
	}
	if !errors.Is(err, errPipelineHook) {
		t.Errorf("Acquire = %v; want the hook's error", err)
	}
}

// TestBatchReleaseNotBehindWait: with the replica paused, every synced
// acquisition waits out WAIT's timeout on its connection; a Release (which
// needs no WAIT) with a shorter deadline must not wait behind them in the
// queue of batches and fail, leaving its lock held for its lease time.
func TestBatchReleaseNotBehindWait(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const waitTimeout = 3 * time.Second
	l, err := New(primary.Client(t), &Options{ReplicaSync: ReplicaSync{Replicas: 1, Timeout: waitTimeout}})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, "lock:held", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	replica.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { replica.Signal(syscall.SIGCONT) })
	admin := primary.Client(t)
	blocked := func(n int) func() bool {
		return func() bool {
			info, err := admin.Info(ctx, "clients").Result()
			return err == nil && strings.Contains(info, fmt.Sprintf("blocked_clients:%d\r", n))
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// One straight through and one in each sender's batch, each held by
	// its WAIT (a blocked client on the server) for waitTimeout.
	for i := range 1 + maxBatches {
		wg.Go(func() {
			_, err := l.Acquire(ctx, fmt.Sprintf("lock:synced:%d", i), fence.TTL(time.Minute))
			if !errors.Is(err, fence.ErrNotReplicated) {
				t.Errorf("Acquire with the replica paused = %v; want fence.ErrNotReplicated", err)
			}
		})
		eventually(t, blocked(i+1))
	}
	const deadline = 500 * time.Millisecond
	rctx, rcancel := context.WithTimeout(ctx, deadline)
	defer rcancel()
	start := time.Now()
	err = lease.Release(rctx)
	t.Logf("Release: %v after %v", err, time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Errorf("Release while synced acquisitions wait for the paused replica: %v", err)
	}
	if n := admin.Exists(ctx, l.keys("lock:held").lock).Val(); n != 0 {
		t.Error("the released lock is still held")
	}
}

// flushThenPause is a client hook that, before the first synced batch (a
// pipeline with WAIT and two or more scripts sent by SHA), flushes the
// server's script cache (flush), so that they fail with NOSCRIPT, and
// before the first synced pipeline with two or more sent in full (EVAL:
// that batch sent again), pauses the replica (pause), so that its writes
// never reach it; names are the lock keys in the latter. Pipelines without
// WAIT are not looked at: the unsynced batcher's (releases) fail NOSCRIPT
// after the flush too, and are sent again in full, but their locks were
// acquired, and synced, before it.
type flushThenPause struct {
	flush, pause func()

	mu            sync.Mutex
	flushed, done bool
	names         []string
}

func (h *flushThenPause) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *flushThenPause) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *flushThenPause) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var bySHA int
		var names []string
		synced := false
		for _, cmd := range cmds {
			switch cmd.Name() {
			case "evalsha":
				bySHA++
			case "eval":
				names = append(names, fmt.Sprint(cmd.Args()[3]))
			case "wait":
				synced = true
			}
		}
		h.mu.Lock()
		switch {
		case !synced:
		case !h.flushed && bySHA >= 2:
			h.flushed = true
			h.flush()
		case h.flushed && !h.done && len(names) >= 2:
			h.done, h.names = true, names
			h.pause()
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// TestBatchNoScriptResendWaitsAgain: SCRIPT FLUSH just before a batch of
// synced acquisitions goes out: they fail with NOSCRIPT, and the batch's
// WAIT, which counted no write of theirs, returns at once. They go again in full, and the replica is
// paused just before that pipeline: none of them may be reported synced by
// the first WAIT, each is refused (fence.ErrNotReplicated) and its lock
// given back. (Giving the sent-again calls the first WAIT's count fails
// this test.)
func TestBatchNoScriptResendWaitsAgain(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := patientClient(t, redis.Options{Addr: primary.Addr, ContextTimeoutEnabled: true})
	admin := primary.Client(t)
	h := &flushThenPause{
		flush: func() { _ = admin.ScriptFlush(ctx).Err() },
		pause: func() { replica.Signal(syscall.SIGSTOP) },
	}
	t.Cleanup(func() { replica.Signal(syscall.SIGCONT) })
	l, err := New(c, &Options{ReplicaSync: ReplicaSync{Replicas: 1, Timeout: 300 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	warm(ctx, t, l)
	c.AddHook(h)
	resume := primary.Pause(t)
	// One straight through, one in each sender's batch, the others
	// queued for the next batch.
	const n = 8
	errs := make(map[string]error, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		name := fmt.Sprintf("lock:flushed:%d", i)
		wg.Go(func() {
			lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
			if err == nil {
				_ = lease.Release(ctx)
			}
			mu.Lock()
			errs[l.keys(name).lock] = err
			mu.Unlock()
		})
		eventually(t, batchState(l, func(*batcher) bool {
			b := &l.syncBatch
			b.mu.Lock()
			defer b.mu.Unlock()
			return b.inflight+b.inBatch+len(b.queue) == i+1
		}))
	}
	resume()
	wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.names) < 2 {
		t.Fatalf("no batch was sent again in full after NOSCRIPT (%v)", h.names)
	}
	for _, key := range h.names {
		err := errs[key]
		t.Logf("%s, sent again after the replica was paused: %v", key, err)
		if !errors.Is(err, fence.ErrNotReplicated) {
			t.Errorf("Acquire %s, written after the replica was paused = %v; want fence.ErrNotReplicated", key, err)
		}
	}
	if keys := admin.Keys(ctx, "fence:{lock:flushed:*}").Val(); len(keys) != 0 {
		t.Errorf("refused locks left held: %v", keys)
	}
}

// TestBatchClientVariants: many goroutines contend for a few locks (queue,
// grants, renewals and releases batched together) on clients a user may
// hand over: a pool of one connection with retries and context timeouts,
// and a client without retries. No two holders of a name overlap, tokens of a name only grow
// in the order the holders had it, and no lock is left held.
func TestBatchClientVariants(t *testing.T) {
	variants := map[string]func(addr string) redis.UniversalClient{
		"PoolSize1": func(addr string) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, MaxRetries: 5, ContextTimeoutEnabled: true})
		},
		"NoRetries": func(addr string) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ReadTimeout: 2 * time.Second})
		},
	}
	for name, newClient := range variants {
		t.Run(name, func(t *testing.T) {
			srv := redistest.Start(t)
			c := newClient(srv.Addr)
			t.Cleanup(func() { _ = c.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			l, err := New(c, nil)
			if err != nil {
				t.Fatal(err)
			}
			const names, goroutines, rounds = 4, 16, 12
			var holders [names]struct {
				mu   sync.Mutex
				held bool
				last fence.Token
			}
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for r := range rounds {
						i := (g + r) % names
						lease, err := l.Acquire(ctx, fmt.Sprintf("lock:variant:%d", i), fence.TTL(10*time.Second), fence.Wait(30*time.Second))
						if err != nil {
							t.Errorf("Acquire: %v", err)
							return
						}
						h := &holders[i]
						h.mu.Lock()
						if h.held {
							t.Errorf("lock:variant:%d: two holders at once", i)
						}
						if lease.Token() <= h.last {
							t.Errorf("lock:variant:%d: token %d after %d", i, lease.Token(), h.last)
						}
						h.held, h.last = true, lease.Token()
						h.mu.Unlock()
						if err := lease.Extend(ctx, 10*time.Second); err != nil {
							t.Errorf("Extend: %v", err)
						}
						h.mu.Lock()
						h.held = false
						h.mu.Unlock()
						if err := lease.Release(ctx); err != nil {
							t.Errorf("Release: %v", err)
						}
					}
				})
			}
			wg.Wait()
			_, sent, _ := batchStats(l)
			t.Logf("%d commands sent in batches", sent)
			if sent == 0 {
				t.Error("no command went in a batch")
			}
			admin := srv.Client(t)
			if keys := admin.Keys(ctx, "fence:{lock:variant:*}").Val(); len(keys) != 0 {
				t.Errorf("locks left held: %v", keys)
			}
		})
	}
}

// TestRingWaiter: a waiting Acquire on a *redis.Ring (here of one shard)
// must work. Its
// subscription crashed the process (go-redis's Ring.Subscribe panics when
// asked for a subscription without a channel).
func TestRingWaiter(t *testing.T) {
	srv := redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	l, err := New(ring, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	holder, err := l.Acquire(ctx, "lock:ring", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctx, "lock:ring", fence.TTL(time.Minute), fence.Wait(5*time.Second))
		if err == nil {
			_ = lease.Release(ctx)
		}
		got <- err
	}()
	admin := srv.Client(t)
	eventually(t, func() bool { return admin.LLen(ctx, l.keys("lock:ring").queue).Val() == 1 })
	_ = holder.Release(ctx)
	if err := <-got; err != nil {
		t.Fatalf("waiting Acquire on a Ring: %v", err)
	}
}

// TestBatchClientClosed: the Locker's client closed while calls are in
// flight on a paused server and more wait in the queue: every caller
// returns an error at once (well before its deadline), and the senders
// end (goleak, in TestMain, finds any goroutine left).
func TestBatchClientClosed(t *testing.T) {
	srv := redistest.Start(t)
	// A read timeout longer than the test: with go-redis's 3 s the batch
	// in flight to the stopped server failed before a loaded run (CI) had
	// queued the other calls, and the state waited for never came.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: time.Minute})
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = c.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, "warm", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	srv.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { srv.Signal(syscall.SIGCONT) })
	// The calls' deadline is long, so that under load they are all
	// queued well before it; Close must end them in a fraction of it.
	const deadline = 20 * time.Second
	const n = 8
	errs := make(chan error, n+1)
	call := func(f func(ctx context.Context) error) {
		go func() {
			dctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			errs <- f(dctx)
		}()
	}
	for i := range n {
		call(func(ctx context.Context) error {
			_, err := l.Acquire(ctx, fmt.Sprintf("lock:closed:%d", i), fence.TTL(time.Minute))
			return err
		})
	}
	call(lease.Release)
	eventually(t, batchState(l, func(b *batcher) bool {
		return b.inflight == 1 && b.batches == maxBatches && b.inBatch+len(b.queue) == n
	}))
	start := time.Now()
	_ = c.Close()
	closed = true
	for range n + 1 {
		if err := <-errs; err == nil {
			t.Error("a call succeeded on a closed client")
		}
	}
	if took := time.Since(start); took > deadline/4 {
		t.Errorf("callers returned %v after the client was closed", took)
	}
	eventually(t, batchState(l, func(b *batcher) bool { return b.batches == 0 && len(b.queue) == 0 }))
}

// pauseAfterUnsyncedTake is a client hook that pauses the replica (pause)
// right after an acquire script on lock, sent without WAIT, took it:
// between a queued first try's take and the synced try that confirms it.
type pauseAfterUnsyncedTake struct {
	lock  string
	pause func()

	mu     sync.Mutex
	paused bool
}

func (h *pauseAfterUnsyncedTake) check(cmds []redis.Cmder) {
	for _, cmd := range cmds {
		if cmd.Name() == "wait" {
			return
		}
	}
	for _, cmd := range cmds {
		args := cmd.Args()
		if !isScript(cmd) || len(args) < 4 || args[3] != h.lock {
			continue
		}
		if args[1] != acquireScript.Hash() && args[1] != acquireSrc {
			continue
		}
		if res, err := cmd.(*redis.Cmd).Int64Slice(); err == nil && len(res) > 0 && res[0] == 1 {
			h.mu.Lock()
			if !h.paused {
				h.paused = true
				h.pause()
			}
			h.mu.Unlock()
		}
	}
}

func (h *pauseAfterUnsyncedTake) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *pauseAfterUnsyncedTake) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.check([]redis.Cmder{cmd})
		return err
	}
}
func (h *pauseAfterUnsyncedTake) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.check(cmds)
		return err
	}
}

// TestUnsyncedTakeReplicaPausedBeforeConfirm: with replica sync, an
// Acquire whose first try goes without WAIT (another Acquire of the Locker
// waits for the lock) finds the lock free and takes it, with the replica
// in sync; the replica is paused right after that take, before the synced
// try that confirms it. No lease may come of it: the confirmation's WAIT
// times out, the Acquire ends with fence.ErrNotReplicated and the lock is
// given back.
func TestUnsyncedTakeReplicaPausedBeforeConfirm(t *testing.T) {
	t.Parallel() // own servers and Lockers; mostly waits on WAITs
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	t.Cleanup(func() { replica.Signal(syscall.SIGCONT) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := primary.Client(t)
	l, err := New(c, &Options{ReplicaSync: ReplicaSync{Timeout: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	const name = "lock:unsynced-pause"
	k := l.keys(name)
	h := &pauseAfterUnsyncedTake{lock: k.lock, pause: func() { replica.Signal(syscall.SIGSTOP) }}
	c.AddHook(h)
	admin := primary.Client(t)
	other, err := New(admin, &Options{ReplicaSync: ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	holder, err := other.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Release(ctx) }()
	first := make(chan error, 1)
	go func() {
		ls, err := l.Acquire(ctx, name, fence.Wait(3*time.Second), fence.TTL(time.Minute))
		if err == nil {
			_ = ls.Release(ctx)
		}
		first <- err
	}()
	// The first waiter is queued, subscribed, and asleep after its last
	// try: it tries once more at once after its subscription is confirmed
	// (see Acquire), and a lock found free by that try is its own, taken
	// with WAIT; the Acquire below then found no waiter and went synced,
	// with a lease as it should (seen under load: 2 in a few hundred
	// runs). Its timer is set only when it sleeps.
	eventually(t, func() bool {
		l.mu.Lock()
		w := l.subscriptions[k.channel]
		asleep := w != nil && len(w.waiters) == 1 && !w.waiters[0].until.IsZero()
		l.mu.Unlock()
		subs := admin.PubSubNumSub(ctx, k.channel).Val()[k.channel]
		return asleep && admin.LLen(ctx, k.queue).Val() == 1 && subs == 1
	})
	// The holder's lease runs out and the queue is lost: the next Acquire
	// finds the lock free.
	if err := admin.Del(ctx, k.lock, k.queue, k.waiters).Err(); err != nil {
		t.Fatal(err)
	}
	ls, err := l.Acquire(ctx, name, fence.Wait(time.Second), fence.TTL(time.Minute))
	h.mu.Lock()
	paused := h.paused
	h.mu.Unlock()
	if !paused {
		t.Fatalf("no try without WAIT took the lock (Acquire: %v)", err)
	}
	if err == nil {
		t.Fatalf("a lease (token %d) from a take the replica never acknowledged", ls.Token())
	}
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Errorf("Acquire = %v; want fence.ErrNotReplicated", err)
	}
	eventually(t, func() bool { return admin.Get(ctx, k.lock).Val() == "" })
	if err := <-first; err == nil {
		t.Error("the first waiter took the lock with the replica paused")
	}
}

// TestBatchReleaseThenAcquire: pairs of goroutines hand locks back and
// forth under load that keeps every call batched: once one's Release has
// returned, the other's Acquire without a wait budget, sent in a later
// batch (maybe by the other sender, on another connection), finds the lock
// free. A reply handed back before its command ran, or to the wrong
// caller, fails it.
func TestBatchReleaseThenAcquire(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	const pairs, rounds = 12, 40
	var wg sync.WaitGroup
	for p := range pairs {
		name := fmt.Sprintf("lock:handoff:%d", p)
		// turn[side] tells side that the other side's Release returned.
		turn := [2]chan bool{make(chan bool, 1), make(chan bool, 1)}
		turn[0] <- true
		for side := range 2 {
			wg.Go(func() {
				defer close(turn[1-side])
				for range rounds / 2 {
					if ok := <-turn[side]; !ok {
						return
					}
					lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
					if err != nil {
						t.Errorf("%s: Acquire right after the other's Release returned: %v", name, err)
						return
					}
					if err := lease.Release(ctx); err != nil {
						t.Errorf("%s: Release: %v", name, err)
						return
					}
					turn[1-side] <- true
				}
			})
		}
	}
	wg.Wait()
	if _, sent, _ := batchStats(l); sent == 0 {
		t.Fatal("no command went in a batch")
	} else {
		t.Logf("%d commands sent in batches", sent)
	}
}

// TestBatchNoScriptWaitsOnce: as TestNoScriptWaitsOnce, for synced
// acquisitions sent in batches: with the replica paused, a batch refused
// with NOSCRIPT has already waited out the sync timeout (the batch's WAIT
// ran with the refused EVALSHAs), so the WAIT sent again with the scripts
// in full gets what is left of it, not the whole timeout again. Read from
// the WAIT commands sent (a timing of whole rounds of batches varies with
// how the calls fall into them).
func TestBatchNoScriptWaitsOnce(t *testing.T) {
	t.Parallel() // own servers and Locker; mostly waits out WAIT timeouts
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := primary.Client(t)
	c := primary.Client(t)
	const timeout = time.Second
	l, err := New(c, &Options{ReplicaSync: ReplicaSync{Replicas: 1, Timeout: timeout}})
	if err != nil {
		t.Fatal(err)
	}
	warm(ctx, t, l)
	h := &evalWaits{}
	c.AddHook(h)
	replica.Pause(t)
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := l.Acquire(ctx, fmt.Sprintf("lock:flushed:%d", i), fence.TTL(time.Minute))
			if !errors.Is(err, fence.ErrNotReplicated) {
				t.Errorf("Acquire with the replica paused = %v, want ErrNotReplicated", err)
			}
		})
	}
	wg.Wait()
	l.syncBatch.mu.Lock()
	again := l.syncBatch.again
	l.syncBatch.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	t.Logf("WAIT timeouts (ms) sent with scripts in full: %v; batched calls sent again: %d", h.ms, again)
	if again == 0 {
		t.Fatal("no batched call was sent again after NOSCRIPT: the test did not test batches")
	}
	for _, ms := range h.ms {
		if ms > timeout.Milliseconds()/2 {
			t.Errorf("a WAIT sent again after NOSCRIPT waits %d ms, after the first had waited out the %v timeout", ms, timeout)
		}
	}
}

// evalWaits records the timeout of each WAIT sent in a pipeline with a
// script in full (EVAL): one sent again after NOSCRIPT.
type evalWaits struct {
	mu sync.Mutex
	ms []int64
}

func (h *evalWaits) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *evalWaits) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *evalWaits) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		eval := false
		for _, cmd := range cmds {
			switch a := cmd.Args(); strings.ToLower(fmt.Sprint(a[0])) {
			case "eval":
				eval = true
			case "wait":
				if eval {
					h.mu.Lock()
					h.ms = append(h.ms, a[2].(int64))
					h.mu.Unlock()
				}
			}
		}
		return next(ctx, cmds)
	}
}
