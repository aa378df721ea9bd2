package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencekit/fence/internal/redisconn"
	"github.com/redis/go-redis/v9"
)

// Natural batching (issue 18) of script calls on the Locker's own
// *redis.Client.
//
// A script call that finds no other call of the Locker in flight goes
// straight through on the caller's goroutine, as before (runScript): the
// uncontended call pays a mutex and two counter updates, nothing more. A
// call that finds maxDirect calls in flight joins a queue; a sender
// goroutine (at most maxBatches of them) takes the whole queue and sends
// it as one pipeline, on one connection: one write, one read on the
// server for every command in it, as rueidis's automatic pipelining does.
// Each reply goes back to its caller; commands that fail with NOSCRIPT are
// sent again with EVAL, in a second pipeline. With replica sync, one WAIT
// after the batch's commands stands for all of them (batchWait). Calls
// with WAIT and calls without are batched apart (Locker.batch and
// Locker.syncBatch, each with its own direct slot and senders): a WAIT
// holds its connection until the replicas acknowledge or its timeout ends,
// and a call that needs none (a release, a queued try) must not wait behind
// it, nor queue behind the senders it holds, when a replica is slow or gone.
// Status's reads (scripts sent in full) are never batched, for the same
// reason: a write pause holds the batches' writes (see evalPipelined).
//
// The client's hooks see a batch as one pipeline (ProcessPipelineHook),
// sent with the first caller's context values (batchContext); a call that
// goes straight through is seen as before.
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

// How many calls go straight through at once, and how many pipelines may
// be in flight: the settings an experiment found best on the distinct-keys
// workload (bench/batching.md; one straight through and one pipeline in
// flight paid more client and server CPU per acquire+release).
const (
	maxDirect  = 1
	maxBatches = 2
)

// errNotSent is in the error of a call that left the queue before a sender
// took it: it never reached the server (giveUpMaybeHeld gives back
// nothing).
var errNotSent = errors.New("redislock: batched call never sent")

// batchCall is one caller's command in a batch.
type batchCall struct {
	ctx      context.Context
	cmd      *redis.Cmd
	required int           // replicas that must acknowledge (WAIT), or 0
	done     chan struct{} // closed by the sender once cmd has its reply
	taken    bool          // taken by a sender; guarded by batcher.mu
	left     bool          // the caller left before it was taken; guarded by batcher.mu
	acked    int           // WAIT's reply, when required > 0
	waitErr  error         // WAIT's error, when required > 0
}

// batchable returns the Locker's own *redis.Client when c is it (and the
// Locker is not on a cluster), or nil.
func (l *Locker) batchable(c redis.Cmdable) *redis.Client {
	own, _ := l.client.(*redis.Client)
	rc, _ := c.(*redis.Client)
	if own == nil || rc != own || l.sharded {
		return nil
	}
	return own
}

// enter reports whether a call goes straight through (fewer than maxDirect
// in flight); then the caller calls leave when it is done.
func (b *batcher) enter() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inflight < maxDirect {
		b.inflight++
		return true
	}
	return false
}

// leave ends a call that enter let through.
func (b *batcher) leave() {
	b.mu.Lock()
	b.inflight--
	b.mu.Unlock()
}

// evalBatched sends script in b's next batch on c, followed in it by WAIT
// when required > 0, and returns as evalPipelined does.
func (l *Locker) evalBatched(ctx context.Context, b *batcher, c *redis.Client, required int, script *redis.Script, keys skeys, args []any) (*redis.Cmd, int, error) {
	bc := &batchCall{ctx: ctx, cmd: scriptCmd(ctx, script, false, keys, args), required: required, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, bc)
	if b.batches < maxBatches {
		b.batches++
		go l.sendBatches(b, c)
	}
	b.mu.Unlock()
	reply, ok := bc.wait(b)
	if err := reply.Err(); err != nil || !ok || required == 0 {
		return reply, 0, err
	}
	if bc.waitErr != nil {
		return reply, 0, waitError(bc.waitErr)
	}
	return reply, bc.acked, nil
}

// wait returns bc's command once it has its reply, or a command with an
// error when bc's context ends first (see batcher), and whether it had its
// reply.
func (bc *batchCall) wait(b *batcher) (*redis.Cmd, bool) {
	select {
	case <-bc.done:
		return bc.cmd, true
	case <-bc.ctx.Done():
	}
	b.mu.Lock()
	if !bc.taken {
		bc.left = true
		b.mu.Unlock()
		cmd := redis.NewCmd(bc.ctx)
		cmd.SetErr(fmt.Errorf("%w: %w", errNotSent, bc.ctx.Err()))
		return cmd, false
	}
	b.mu.Unlock()
	if dl, ok := bc.ctx.Deadline(); ok && time.Until(dl) > 0 {
		// Cancelled before its deadline: wait for the reply or the
		// deadline.
		t := time.NewTimer(time.Until(dl))
		defer t.Stop()
		select {
		case <-bc.done:
			return bc.cmd, true
		case <-t.C:
		}
	} else if !ok {
		<-bc.done // no deadline: only under bounded, which leaves by itself
		return bc.cmd, true
	}
	select {
	case <-bc.done:
		return bc.cmd, true
	default:
	}
	cmd := redis.NewCmd(bc.ctx)
	cmd.SetErr(fmt.Errorf("redislock: batched call: %w", context.DeadlineExceeded))
	return cmd, false
}

// sendBatches takes the queue and sends it as one pipeline on c, until the
// queue is empty.
func (l *Locker) sendBatches(b *batcher, c *redis.Client) {
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
		sent := time.Now()
		wait := l.batchWait(ctx, calls, &cmds, l.sync.Timeout)
		execBatch(ctx, c, cmds)
		// NOSCRIPT: again in full, for the commands that had it, with a
		// WAIT of their own after them.
		var again []*batchCall
		for _, bc := range calls {
			if err := bc.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				args := append([]any(nil), bc.cmd.Args()...)
				src := scriptBySHA(args[1])
				if src == nil {
					continue
				}
				args[0], args[1] = "eval", src
				bc.cmd = redis.NewCmd(bc.ctx, args...)
				bc.cmd.SetFirstKeyPos(3)
				again = append(again, bc)
			}
		}
		setAcked(calls, wait)
		if len(again) > 0 {
			var cmds []redis.Cmder
			for _, bc := range again {
				cmds = append(cmds, bc.cmd)
			}
			wait := l.batchWait(ctx, again, &cmds, waitAgain(l.sync.Timeout, sent, calls, wait))
			execBatch(ctx, c, cmds)
			setAcked(again, wait)
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

// execBatch sends cmds as one pipeline on c.
func execBatch(ctx context.Context, c *redis.Client, cmds []redis.Cmder) {
	pipe := c.Pipeline()
	_ = pipe.BatchProcess(ctx, cmds...)
	_, err := pipe.Exec(ctx)
	unanswered(cmds, err)
}

// unanswered gives err, a pipeline's error, to those of its commands that
// have neither a reply nor an error: a hook that failed the pipeline
// without sending it (a circuit breaker, say) leaves them so, where a
// single command's hook error is the command's own (Client.Process). A
// command whose reply was nil has redis.Nil.
func unanswered(cmds []redis.Cmder, err error) {
	if err == nil {
		return
	}
	for _, cmd := range cmds {
		if c, ok := cmd.(*redis.Cmd); ok && c.Err() == nil && c.Val() == nil {
			c.SetErr(err)
		}
	}
}

// batchWait appends to cmds, when a call in calls requires replica
// acknowledgements, one WAIT for the most any of them requires, and
// returns it: WAIT counts the replicas that acknowledged every write sent
// before it on the connection, which the pipeline's are. Nil when none
// does.
func (l *Locker) batchWait(ctx context.Context, calls []*batchCall, cmds *[]redis.Cmder, timeout time.Duration) *redis.Cmd {
	required := 0
	for _, bc := range calls {
		required = max(required, bc.required)
	}
	if required == 0 {
		return nil
	}
	wait := redis.NewCmd(ctx, "WAIT", required, timeout.Milliseconds())
	*cmds = append(*cmds, wait)
	return wait
}

// waitAgain is the timeout of the WAIT sent with a batch's calls sent
// again after NOSCRIPT, given the batch's calls and their WAIT, first (see
// redisconn.WaitLeft).
func waitAgain(timeout time.Duration, sent time.Time, calls []*batchCall, first *redis.Cmd) time.Duration {
	acked, required := -1, 0
	for _, bc := range calls {
		required = max(required, bc.required)
	}
	if first != nil {
		if n, err := first.Int(); err == nil {
			acked = n
		}
	}
	return redisconn.WaitLeft(timeout, sent, acked, required)
}

// setAcked gives WAIT's reply to the calls that required it, and clears
// the error that a WAIT not answered in time gave every command whose
// reply was read (readBeforeWait).
func setAcked(calls []*batchCall, wait *redis.Cmd) {
	if wait == nil {
		return
	}
	acked, err := wait.Int()
	for _, bc := range calls {
		readBeforeWait(bc.cmd, wait)
		if bc.required > 0 {
			bc.acked, bc.waitErr = acked, err
		}
	}
}

// batchContext is the context a batch is sent with: the first caller's
// values (a tracing hook's span, say), without the callers' cancellation
// (one caller leaving must not fail the others), with the latest of their
// deadlines, or none when one of them has none (then the client's own
// timeouts end it).
func batchContext(calls []*batchCall) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(calls[0].ctx)
	var latest time.Time
	for _, bc := range calls {
		dl, ok := bc.ctx.Deadline()
		if !ok {
			return base, func() {}
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	return context.WithDeadline(base, latest)
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
