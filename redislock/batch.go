package redislock

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// EXPERIMENT (issue 18): natural batching of script calls on the Locker's
// own *redis.Client.
//
// A script call that finds no other call of the Locker in flight goes
// straight through on the caller's goroutine, as before (runScript): the
// uncontended call pays a mutex and two counter updates, nothing more. A
// call that finds maxDirect calls in flight joins a queue; a sender
// goroutine (at most maxBatches of them) takes the whole queue and sends
// it as one pipeline, on one connection: one write, one read on the
// server for every command in it, as rueidis's automatic pipelining does.
// Each reply goes back to its caller; commands that fail with NOSCRIPT are
// sent again with EVAL, in a second pipeline.
//
// A caller whose context ends before its command was taken leaves the
// queue: its command is never sent. One whose context ends after its
// command was taken stops waiting at its deadline (a cancellation before
// the deadline keeps it waiting for the reply or the deadline, as a direct
// call on a client with ContextTimeoutEnabled does), with an error naming
// the deadline, so that an acquisition is treated as one that may have
// run (giveUpMaybeHeld), exactly as a direct call that timed out; under
// bounded, bounded gives up itself and its abandoned callback sees the
// late result.
type batcher struct {
	mu       sync.Mutex
	inflight int          // direct calls in flight
	batches  int          // senders running
	queue    []*batchCall // waiting to be taken by a sender

	// For tests: commands in batches in flight, commands sent in
	// batches, and sent again with EVAL after NOSCRIPT.
	inBatch, sent, again int
}

// Tuning of the experiment: how many calls go straight through at once,
// and how many pipelines may be in flight.
var (
	maxDirect  = 1
	maxBatches = 2
)

// FENCE_BATCH=direct,batches sets them, for the experiment's measurements;
// batches 0 turns batching off.
func init() {
	if v := os.Getenv("FENCE_BATCH"); v != "" {
		_, _ = fmt.Sscanf(v, "%d,%d", &maxDirect, &maxBatches)
	}
}

// batchCall is one caller's command in a batch.
type batchCall struct {
	ctx   context.Context
	cmd   *redis.Cmd
	done  chan struct{} // closed by the sender once cmd has its reply
	taken bool          // taken by a sender; guarded by batcher.mu
	left  bool          // the caller left before it was taken; guarded by batcher.mu
}

// script runs script on c: batched when c is the Locker's own *redis.Client
// and another call is in flight, otherwise as runScript does.
func (l *Locker) script(ctx context.Context, c redis.Cmdable, script *redis.Script, keys skeys, args []any) *redis.Cmd {
	own, _ := l.client.(*redis.Client)
	rc, _ := c.(*redis.Client)
	if own == nil || rc != own || l.sharded || maxBatches == 0 {
		return runScript(ctx, c, script, keys, args)
	}
	b := &l.batch
	b.mu.Lock()
	if b.inflight < maxDirect {
		b.inflight++
		b.mu.Unlock()
		cmd := runScript(ctx, c, script, keys, args)
		b.mu.Lock()
		b.inflight--
		b.mu.Unlock()
		return cmd
	}
	bc := &batchCall{ctx: ctx, cmd: scriptCmd(ctx, script, false, keys, args), done: make(chan struct{})}
	b.queue = append(b.queue, bc)
	if b.batches < maxBatches {
		b.batches++
		go l.sendBatches(own)
	}
	b.mu.Unlock()
	return bc.wait(b)
}

// wait returns bc's command once it has its reply, or with an error when
// bc's context ends first (see batcher).
func (bc *batchCall) wait(b *batcher) *redis.Cmd {
	select {
	case <-bc.done:
		return bc.cmd
	case <-bc.ctx.Done():
	}
	b.mu.Lock()
	if !bc.taken {
		bc.left = true
		b.mu.Unlock()
		cmd := redis.NewCmd(bc.ctx)
		cmd.SetErr(bc.ctx.Err()) // never sent
		return cmd
	}
	b.mu.Unlock()
	if dl, ok := bc.ctx.Deadline(); ok && time.Until(dl) > 0 {
		// Cancelled before its deadline: wait for the reply or the
		// deadline.
		t := time.NewTimer(time.Until(dl))
		defer t.Stop()
		select {
		case <-bc.done:
			return bc.cmd
		case <-t.C:
		}
	} else if !ok {
		<-bc.done // no deadline: only under bounded, which leaves by itself
		return bc.cmd
	}
	select {
	case <-bc.done:
		return bc.cmd
	default:
	}
	cmd := redis.NewCmd(bc.ctx)
	cmd.SetErr(fmt.Errorf("redislock: batched call: %w", context.DeadlineExceeded))
	return cmd
}

// sendBatches takes the queue and sends it as one pipeline on c, until the
// queue is empty.
func (l *Locker) sendBatches(c *redis.Client) {
	b := &l.batch
	var calls []*batchCall
	var cmds []redis.Cmder
	for {
		b.mu.Lock()
		calls = calls[:0]
		for _, bc := range b.queue {
			if !bc.left {
				bc.taken = true
				calls = append(calls, bc)
			}
		}
		clear(b.queue)
		b.queue = b.queue[:0]
		if len(calls) == 0 {
			b.batches--
			b.mu.Unlock()
			return
		}
		b.inBatch += len(calls)
		b.sent += len(calls)
		b.mu.Unlock()
		ctx, cancel := batchContext(calls)
		cmds = cmds[:0]
		for _, bc := range calls {
			cmds = append(cmds, bc.cmd)
		}
		pipe := c.Pipeline()
		_ = pipe.BatchProcess(ctx, cmds...)
		_, _ = pipe.Exec(ctx)
		// NOSCRIPT: again in full, for the commands that had it.
		var again []redis.Cmder
		var idx []int
		for i, bc := range calls {
			if err := bc.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				args := append([]any(nil), bc.cmd.Args()...)
				sa := scriptBySHA(args[1])
				if sa == nil {
					continue
				}
				args[0], args[1] = "eval", sa
				cmd := redis.NewCmd(bc.ctx, args...)
				cmd.SetFirstKeyPos(3)
				again = append(again, cmd)
				idx = append(idx, i)
			}
		}
		if len(again) > 0 {
			pipe := c.Pipeline()
			_ = pipe.BatchProcess(ctx, again...)
			_, _ = pipe.Exec(ctx)
			for j, i := range idx {
				calls[i].cmd = again[j].(*redis.Cmd)
			}
		}
		cancel()
		b.mu.Lock()
		b.inBatch -= len(calls)
		b.again += len(again)
		b.mu.Unlock()
		for _, bc := range calls {
			close(bc.done)
		}
		clear(calls)
	}
}

// batchContext is the context a batch is sent with: without the callers'
// cancellation (one caller leaving must not fail the others), with the
// latest of their deadlines, or none when one of them has none (then the
// client's own timeouts end it).
func batchContext(calls []*batchCall) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, bc := range calls {
		dl, ok := bc.ctx.Deadline()
		if !ok {
			return context.Background(), func() {}
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// scriptBySHA is the boxed source of the script whose boxed SHA is sha, or
// nil.
func scriptBySHA(sha any) any {
	for _, sa := range scriptArgs {
		if sa.sha == sha {
			return sa.src
		}
	}
	return nil
}
