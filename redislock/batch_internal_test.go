package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// batchStats reads l's batch counters, of calls with WAIT and without.
func batchStats(l *Locker) (inBatch, sent, again int) {
	for _, b := range []*batcher{&l.batch, &l.syncBatch} {
		b.mu.Lock()
		inBatch, sent, again = inBatch+b.inBatch, sent+b.sent, again+b.again
		b.mu.Unlock()
	}
	return inBatch, sent, again
}

// TestBatchMixedCallsManyLockers: acquisitions, extensions and releases of
// several Lockers on one client, from many goroutines at once, go in
// batches (each Locker its own), and each caller gets its own reply: the
// token of its own lock, its own extension and release.
func TestBatchMixedCallsManyLockers(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var lockers []*Locker
	for i := range 3 {
		l, err := New(c, &Options{Prefix: fmt.Sprintf("batch%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		lockers = append(lockers, l)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 48 {
		wg.Go(func() {
			l := lockers[g%len(lockers)]
			name := fmt.Sprintf("lock:batch:%d", g)
			last := fence.Token(0)
			for range 30 {
				lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
				if err != nil {
					errs <- fmt.Errorf("Acquire %s: %w", name, err)
					return
				}
				if lease.Token() <= last {
					errs <- fmt.Errorf("%s: token %d after %d", name, lease.Token(), last)
				}
				last = lease.Token()
				if err := lease.Extend(ctx, 2*time.Minute); err != nil {
					errs <- fmt.Errorf("Extend %s: %w", name, err)
				}
				if err := lease.Release(ctx); err != nil {
					errs <- fmt.Errorf("Release %s: %w", name, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	total := 0
	for i, l := range lockers {
		_, sent, _ := batchStats(l)
		t.Logf("locker %d: %d commands sent in batches", i, sent)
		total += sent
	}
	if total == 0 {
		t.Fatal("no command went in a batch")
	}
	admin := srv.Client(t)
	for i := range lockers {
		if n := len(admin.Keys(ctx, fmt.Sprintf("batch%d:{*}", i)).Val()); n != 0 {
			t.Errorf("locker %d: %d locks left held", i, n)
		}
	}
}

// TestBatchNoScriptAfterFlush: SCRIPT FLUSH while batches are sent: the
// commands that fail with NOSCRIPT go again in full, and no caller sees
// the error.
func TestBatchNoScriptAfterFlush(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	admin := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 32 {
		wg.Go(func() {
			name := fmt.Sprintf("lock:flush:%d", g)
			for {
				select {
				case <-stop:
					return
				default:
				}
				lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
				if err != nil {
					errs <- fmt.Errorf("Acquire %s: %w", name, err)
					return
				}
				if err := lease.Release(ctx); err != nil {
					errs <- fmt.Errorf("Release %s: %w", name, err)
					return
				}
			}
		})
	}
	// Flush until enough batched commands met NOSCRIPT, or 10 s.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Error(err)
			break
		}
		if _, _, again := batchStats(l); again >= 20 || time.Now().After(deadline) {
			break
		}
		if len(errs) > 0 {
			break
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	_, sent, again := batchStats(l)
	t.Logf("%d commands sent in batches, %d again after NOSCRIPT", sent, again)
	if again == 0 {
		t.Fatal("no batched command met NOSCRIPT")
	}
}

// TestBatchHungServer: on a paused redis-server, a batch of acquisitions,
// extensions and releases is in flight, one of the acquiring callers
// cancels; every caller returns with an error within its deadline. When
// the server resumes, the acquisitions given up on run, and each is given
// back or revoked: no lock stays held.
func TestBatchHungServer(t *testing.T) {
	t.Parallel() // own servers and Lockers; mostly waits out deadlines (300 ms slack, as the hang tests)
	for _, cte := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", cte), func(t *testing.T) { testBatchFault(t, cte, false) })
	}
}

// TestBatchKilledServer: the server killed while a batch is in flight:
// every caller in it gets an error within its deadline.
func TestBatchKilledServer(t *testing.T) {
	t.Parallel() // own servers and Lockers; mostly waits out deadlines (300 ms slack, as the hang tests)
	for _, cte := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", cte), func(t *testing.T) { testBatchFault(t, cte, true) })
	}
}

func testBatchFault(t *testing.T, cte, kill bool) {
	const deadline, slack = 750 * time.Millisecond, 300 * time.Millisecond
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: cte, PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	const held = 4
	var leases []fence.Lease
	for i := range held {
		lease, err := l.Acquire(ctx, fmt.Sprintf("held:%d", i), fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, lease)
	}
	srv.Signal(syscall.SIGSTOP)
	resumed := false
	resume := func() {
		if !resumed && !kill {
			resumed = true
			srv.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)

	type result struct {
		what string
		err  error
		took time.Duration
	}
	const acquirers = 12
	results := make(chan result, acquirers+2*held)
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	var wg sync.WaitGroup
	call := func(what string, parent context.Context, f func(ctx context.Context) error) {
		wg.Go(func() {
			dctx, cancel := context.WithTimeout(parent, deadline)
			defer cancel()
			start := time.Now()
			err := f(dctx)
			results <- result{what, err, time.Since(start)}
		})
	}
	for i := range acquirers {
		parent := ctx
		if i == acquirers-1 {
			parent = cctx // cancelled mid-flight
		}
		name := fmt.Sprintf("lock:hung:%d", i)
		call("Acquire "+name, parent, func(ctx context.Context) error {
			_, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
			return err
		})
	}
	for i, lease := range leases {
		if i%2 == 0 {
			call(fmt.Sprintf("Extend held:%d", i), ctx, func(ctx context.Context) error { return lease.Extend(ctx, time.Minute) })
		} else {
			call(fmt.Sprintf("Release held:%d", i), ctx, func(ctx context.Context) error { return lease.Release(ctx) })
		}
	}
	// All but the one that went straight through are in a batch in
	// flight (or queued behind it, when maxBatches are in flight).
	eventually(t, func() bool {
		l.batch.mu.Lock()
		defer l.batch.mu.Unlock()
		return l.batch.inBatch+len(l.batch.queue) >= acquirers+held-1 && l.batch.inBatch > 0
	})
	ccancel()
	if kill {
		srv.Kill()
	}
	wg.Wait()
	close(results)
	for r := range results {
		t.Logf("%s: %v after %v", r.what, r.err, r.took.Round(time.Millisecond))
		if r.err == nil {
			t.Errorf("%s succeeded on a %s server", r.what, map[bool]string{false: "paused", true: "killed"}[kill])
		}
		if r.took > deadline+slack {
			t.Errorf("%s took %v with a %v deadline", r.what, r.took, deadline)
		}
	}
	if kill {
		return
	}
	resume()
	admin := srv.Client(t)
	eventually(t, func() bool {
		for i := range acquirers {
			if admin.Exists(ctx, l.keys(fmt.Sprintf("lock:hung:%d", i)).lock).Val() != 0 {
				return false
			}
		}
		return true
	})
}

// TestBatchCallerLeavesQueue: a caller whose context ends while its command
// waits in the queue (every sender busy on a paused server) leaves it: its
// command is never sent, and it gets its context's error at once.
func TestBatchCallerLeavesQueue(t *testing.T) {
	srv := redistest.Start(t)
	c := patientClient(t, redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	warm(ctx, t, l)
	srv.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { srv.Signal(syscall.SIGCONT) })
	// Fill the direct slots and every sender.
	var wg sync.WaitGroup
	busy := maxDirect + maxBatches
	for i := range busy {
		wg.Go(func() {
			dctx, cancel := context.WithTimeout(ctx, 20*time.Second) // over when the server resumes
			defer cancel()
			_, _ = l.Acquire(dctx, fmt.Sprintf("busy:%d", i), fence.TTL(time.Minute))
		})
		eventually(t, func() bool {
			l.batch.mu.Lock()
			defer l.batch.mu.Unlock()
			return l.batch.inflight+l.batch.inBatch == i+1
		})
	}
	qctx, qcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(qctx, "queued", fence.TTL(time.Minute))
		done <- err
	}()
	eventually(t, func() bool {
		l.batch.mu.Lock()
		defer l.batch.mu.Unlock()
		return len(l.batch.queue) == 1
	})
	qcancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Acquire = %v, want context.Canceled", err)
		}
	case <-time.After(time.Second):
		t.Error("the queued caller did not leave at its cancellation")
	}
	srv.Signal(syscall.SIGCONT)
	wg.Wait()
	_, sent, _ := batchStats(l)
	if sent != busy-maxDirect {
		t.Errorf("%d commands sent in batches, want %d (the queued one never sent)", sent, busy-maxDirect)
	}
}

// TestBatchReplicaSync: acquisitions with replica sync from many goroutines
// go in batches with one WAIT after them. With the replica in sync every
// one is acknowledged; with its link cut none is, and every caller is
// refused with fence.ErrNotReplicated and its lock given back.
func TestBatchReplicaSync(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(primary.Client(t), &Options{ReplicaSync: ReplicaSync{Replicas: 1, Timeout: 300 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	run := func(prefix string, rounds int, check func(name string, lease fence.Lease, err error) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for g := range 32 {
			wg.Go(func() {
				name := fmt.Sprintf("%s:%d", prefix, g)
				for range rounds {
					lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
					if err := check(name, lease, err); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	run("lock:synced", 20, func(name string, lease fence.Lease, err error) error {
		if err != nil {
			return fmt.Errorf("Acquire %s: %w", name, err)
		}
		return lease.Release(ctx)
	})
	_, sent, _ := batchStats(l)
	if sent == 0 {
		t.Fatal("no command went in a batch")
	}
	before := sent
	redistest.CutLink(t, primary, replica)
	run("lock:cut", 1, func(name string, lease fence.Lease, err error) error {
		if !errors.Is(err, fence.ErrNotReplicated) {
			return fmt.Errorf("Acquire %s with the replica cut off = %v, %v; want fence.ErrNotReplicated", name, lease, err)
		}
		return nil
	})
	_, sent, _ = batchStats(l)
	t.Logf("%d commands sent in batches in sync, %d with the replica cut off", before, sent-before)
	if sent == before {
		t.Error("no command went in a batch with the replica cut off")
	}
	admin := primary.Client(t)
	if n := len(admin.Keys(ctx, "fence:{lock:cut:*}").Val()); n != 0 {
		t.Errorf("%d refused locks left held", n)
	}
}

// TestUncontendedNotBatched: calls one after another each find nothing in
// flight and go straight through, as without batching: the uncontended
// latency does not change.
func TestUncontendedNotBatched(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		lease, err := l.Acquire(ctx, "lock:payment:1001", fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Extend(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, sent, _ := batchStats(l); sent != 0 {
		t.Fatalf("%d uncontended commands went in batches", sent)
	}
}

// TestBatchOneCommandFails: in one batch, the acquisition whose token
// record has the wrong type fails with its own error; the others in the
// same pipeline succeed.
func TestBatchOneCommandFails(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(patientClient(t, redis.Options{Addr: srv.Addr}), nil)
	if err != nil {
		t.Fatal(err)
	}
	warm(ctx, t, l)
	admin := srv.Client(t)
	const bad = "lock:batch:bad"
	if err := admin.RPush(ctx, l.keys(bad).token, "not a token").Err(); err != nil {
		t.Fatal(err)
	}
	resume := srv.Pause(t)
	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	queued := func(want int) func() bool {
		return func() bool {
			l.batch.mu.Lock()
			defer l.batch.mu.Unlock()
			return l.batch.inflight+l.batch.inBatch+len(l.batch.queue) == want
		}
	}
	for i := range n {
		name := fmt.Sprintf("lock:batch:%d", i)
		if i == n-1 {
			// Last, so that it goes in a batch, not straight through.
			name = bad
		}
		wg.Go(func() {
			lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
			if err == nil {
				err = lease.Release(ctx)
			}
			errs[i] = err
		})
		eventually(t, queued(i+1))
	}
	resume()
	wg.Wait()
	for i, err := range errs {
		if i == n-1 {
			if err == nil {
				t.Errorf("Acquire %s with a list for a token record succeeded", bad)
			} else {
				t.Logf("Acquire %s: %v", bad, err)
			}
		} else if err != nil {
			t.Errorf("Acquire lock:batch:%d: %v", i, err)
		}
	}
}

// callerKey marks a caller's context for TestBatchHooksSeePipeline.
type callerKey struct{}

// isScript reports whether cmd is a script call (not, say, a new
// connection's HELLO, which the client's hooks see too).
func isScript(cmd redis.Cmder) bool {
	name := cmd.Name()
	return name == "evalsha" || name == "eval"
}

// seenHook records, for every script call or pipeline of script calls of
// the client's that carries a callerKey, the value (and, for a pipeline,
// how many script calls went in it).
type seenHook struct {
	mu        sync.Mutex
	direct    []string // callerKey values seen by ProcessHook
	pipelined []string // by ProcessPipelineHook, "value:n" for n script calls
}

func (h *seenHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *seenHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if v, ok := ctx.Value(callerKey{}).(string); ok && isScript(cmd) {
			h.mu.Lock()
			h.direct = append(h.direct, v)
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (h *seenHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if v, ok := ctx.Value(callerKey{}).(string); ok {
			n := 0
			for _, cmd := range cmds {
				if isScript(cmd) {
					n++
				}
			}
			if n > 0 { // not a new connection's handshake
				h.mu.Lock()
				h.pipelined = append(h.pipelined, fmt.Sprintf("%s:%d", v, n))
				h.mu.Unlock()
			}
		}
		return next(ctx, cmds)
	}
}

// TestBatchHooksSeePipeline: the client's hooks see a lone call through
// ProcessHook with its caller's context, and a batch of two calls as one
// pipeline (ProcessPipelineHook) carrying the first caller's context
// values (as doc.go and the README say). The server is paused so that the
// direct slot and both senders are busy while two more calls queue, in
// order: "d" then "e".
func TestBatchHooksSeePipeline(t *testing.T) {
	srv := redistest.Start(t)
	c := patientClient(t, redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	h := &seenHook{}
	c.AddHook(h)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	warm(ctx, t, l)
	srv.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { srv.Signal(syscall.SIGCONT) })
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	start := func(v string, busy func() bool) {
		wg.Go(func() {
			vctx := context.WithValue(ctx, callerKey{}, v)
			_, err := l.Acquire(vctx, "lock:hook:"+v, fence.TTL(time.Minute))
			errs <- err
		})
		eventually(t, busy)
	}
	state := func(f func(b *batcher) bool) func() bool {
		return func() bool {
			l.batch.mu.Lock()
			defer l.batch.mu.Unlock()
			return f(&l.batch)
		}
	}
	start("a", state(func(b *batcher) bool { return b.inflight == 1 }))
	start("b", state(func(b *batcher) bool { return b.inBatch == 1 }))
	start("c", state(func(b *batcher) bool { return b.inBatch == 2 }))
	start("d", state(func(b *batcher) bool { return len(b.queue) == 1 }))
	start("e", state(func(b *batcher) bool { return len(b.queue) == 2 }))
	srv.Signal(syscall.SIGCONT)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	t.Logf("ProcessHook: %v; ProcessPipelineHook: %v", h.direct, h.pipelined)
	if len(h.direct) != 1 || h.direct[0] != "a" {
		t.Errorf("ProcessHook saw %v, want the lone call only: [a]", h.direct)
	}
	want := map[string]bool{"b:1": true, "c:1": true, "d:2": true}
	if len(h.pipelined) != len(want) {
		t.Fatalf("ProcessPipelineHook saw %v, want b:1, c:1 and d:2 (d's and e's calls in one pipeline with d's values)", h.pipelined)
	}
	for _, p := range h.pipelined {
		if !want[p] {
			t.Fatalf("ProcessPipelineHook saw %v, want b:1, c:1 and d:2 (d's and e's calls in one pipeline with d's values)", h.pipelined)
		}
	}
}

// warm takes and releases a lock on l, which loads the scripts, so that
// the calls a test then makes are one EVALSHA each.
// patientClient is a client with options o that waits a minute for a
// reply (go-redis's default: 3 s), closed in t.Cleanup: a test that stages
// calls against a stopped server must not see the first call fail while a
// loaded machine is still staging the others.
func patientClient(t *testing.T, o redis.Options) *redis.Client {
	o.ReadTimeout = time.Minute
	c := redis.NewClient(&o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func warm(ctx context.Context, t *testing.T, l *Locker) {
	t.Helper()
	lease, err := l.Acquire(ctx, "warm", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	_ = lease.Release(ctx)
}

// TestBatchContextDeadline: the README says a batch carries the first
// caller's values and the latest of the callers' deadlines; batchContext
// also drops every deadline when one caller has none (its call may take as
// long as the client's own timeouts), which the README left out. No test
// had looked at the deadline: one cut at the first caller's, or the
// earliest, would fail the other callers' calls before theirs.
func TestBatchContextDeadline(t *testing.T) {
	now := time.Now()
	call := func(v string, d time.Duration) *batchCall {
		ctx := context.WithValue(context.Background(), callerKey{}, v)
		if d > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, now.Add(d))
			t.Cleanup(cancel)
		}
		return &batchCall{ctx: ctx}
	}
	first, later, earlier := call("first", 2*time.Second), call("later", 5*time.Second), call("earlier", time.Second)
	ctx, cancel := batchContext([]*batchCall{first, later, earlier})
	dl, ok := ctx.Deadline()
	cancel()
	if !ok || !dl.Equal(now.Add(5*time.Second)) || ctx.Value(callerKey{}) != "first" {
		t.Fatalf("batch of deadlines +2 s, +5 s, +1 s: deadline %v (%v), value %v; want +5 s and the first caller's value", dl.Sub(now), ok, ctx.Value(callerKey{}))
	}
	ctx, cancel = batchContext([]*batchCall{first, call("none", 0), later})
	defer cancel()
	if dl, ok := ctx.Deadline(); ok {
		t.Fatalf("batch with a caller without deadline: deadline +%v; want none", dl.Sub(now))
	}
}
