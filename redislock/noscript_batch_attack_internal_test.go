package redislock

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
	"github.com/redis/go-redis/v9"
)

// evalStall runs f, while armed, before each pipeline that carries a
// script in full (EVAL): one sent again after NOSCRIPT.
type evalStall struct {
	mu sync.Mutex
	f  func()
}

func (h *evalStall) arm(f func()) { h.mu.Lock(); h.f = f; h.mu.Unlock() }

func (h *evalStall) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *evalStall) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *evalStall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if strings.EqualFold(fmt.Sprint(cmd.Args()[0]), "eval") {
				h.mu.Lock()
				f := h.f
				h.mu.Unlock()
				if f != nil {
					f()
				}
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestBatchMixedNoScriptResentWait: batches of acquisitions (their script
// cached) and renewals (theirs flushed: NOSCRIPT, sent again in full with a
// WAIT of their own), sent while the server is held (CLIENT PAUSE) longer
// than the sync timeout. The batch's WAIT counts the replica at once.
//
// Then, the replica stalling 150 ms of the 400 ms timeout as each EVAL
// pipeline goes out: every renewal is confirmed (a WAIT left only the rest
// of the timeout, 1 ms, refused them: the busy server used it up, not the
// replica). And with the replica stopped for good as the first EVAL
// pipeline goes out: every renewal is refused, none confirmed by the
// batch's first WAIT.
func TestBatchMixedNoScriptResentWait(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin := primary.Client(t)
	pauser := primary.Client(t)
	c := primary.Client(t)
	h := &evalStall{}
	c.AddHook(h)
	const (
		timeout = 400 * time.Millisecond
		stall   = 150 * time.Millisecond
		n       = 4
	)
	l, err := New(c, &Options{ReplicaSync: ReplicaSync{Replicas: 1, Timeout: timeout}})
	if err != nil {
		t.Fatal(err)
	}
	warm(ctx, t, l)
	round := func(tag string, stalled func()) (acqErrs, extErrs []error) {
		t.Helper()
		var leases []fence.Lease
		for i := range n {
			lease, err := l.Acquire(ctx, fmt.Sprintf("lock:%s:held:%d", tag, i), fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, lease)
		}
		redistest.WaitReplicated(t, primary, 1)
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.ScriptLoad(ctx, acquireSrc).Err(); err != nil { // acquisitions cached, renewals not
			t.Fatal(err)
		}
		redistest.WaitReplicated(t, primary, 1)
		if err := pauser.Do(ctx, "CLIENT", "PAUSE", (2 * timeout).Milliseconds(), "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		h.arm(stalled)
		var mu sync.Mutex
		var wg sync.WaitGroup
		acq := func(i int) {
			_, err := l.Acquire(ctx, fmt.Sprintf("lock:%s:new:%d", tag, i), fence.TTL(time.Minute))
			mu.Lock()
			acqErrs = append(acqErrs, err)
			mu.Unlock()
		}
		b := &l.syncBatch
		// The server held: an acquisition takes the direct slot, then the
		// renewals go in the batches (their script not loaded by anyone
		// yet), then more acquisitions.
		base := b.sent
		wg.Go(func() { acq(0) })
		awaitBatcher(t, b, func() bool { return b.inflight == 1 })
		for i := range n {
			wg.Go(func() {
				err := leases[i].Extend(ctx, time.Minute)
				mu.Lock()
				extErrs = append(extErrs, err)
				mu.Unlock()
			})
		}
		awaitBatcher(t, b, func() bool { return b.sent-base+len(b.queue) == n })
		for i := 1; i < n; i++ {
			wg.Go(func() { acq(i) })
		}
		wg.Wait()
		h.arm(nil)
		return acqErrs, extErrs
	}

	// A replica a little slow as the renewals are sent again.
	var stalls sync.WaitGroup
	var stalledMu sync.Mutex
	stalling := false
	acqErrs, extErrs := round("slow", func() {
		stalledMu.Lock()
		defer stalledMu.Unlock()
		if stalling {
			return
		}
		stalling = true
		resume := replica.Pause(t)
		stalls.Add(1)
		time.AfterFunc(stall, func() {
			stalledMu.Lock()
			stalling = false
			stalledMu.Unlock()
			resume()
			stalls.Done()
		})
	})
	stalls.Wait()
	l.syncBatch.mu.Lock()
	again, sent := l.syncBatch.again, l.syncBatch.sent
	l.syncBatch.mu.Unlock()
	t.Logf("batched calls: %d sent, %d sent again after NOSCRIPT", sent, again)
	if again == 0 {
		t.Fatal("no batched call was sent again after NOSCRIPT: the test did not test batches")
	}
	for _, err := range append(acqErrs, extErrs...) {
		if err != nil {
			t.Errorf("with the replica stalled %v of a %v timeout: %v, want confirmed", stall, timeout, err)
		}
	}
	if t.Failed() {
		return
	}

	// The replica stopped as the first EVAL pipeline goes out.
	var resume func()
	var once sync.Once
	acqErrs, extErrs = round("stopped", func() { once.Do(func() { resume = replica.Pause(t) }) })
	if resume == nil {
		t.Fatal("no script was sent again in full")
	}
	resume()
	for _, err := range extErrs {
		if !errors.Is(err, fence.ErrNotReplicated) {
			t.Errorf("Extend sent again in full with the replica stopped = %v, want ErrNotReplicated", err)
		}
	}
	for _, err := range acqErrs {
		if err != nil && !errors.Is(err, fence.ErrNotReplicated) {
			t.Errorf("Acquire = %v", err)
		}
	}
}

// awaitBatcher waits until cond, read under b.mu, holds.
func awaitBatcher(t *testing.T, b *batcher, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		ok := cond()
		b.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the calls did not reach the batcher")
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
}
