package redislock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// bounded runs call and returns its result, or ctx's error as soon as ctx is
// done, whichever comes first, whatever the client's options.
//
// go-redis puts ctx's deadline on the socket only with ContextTimeoutEnabled;
// otherwise a server that hangs (paused, or a listener that never answers)
// holds a command for the client's ReadTimeout, 3 s by default, and a
// connection pool wait or a dial can add more. Refusing such clients in New
// would refuse go-redis's defaults, so every call fence makes goes through
// here instead. Unless the client bounds its calls itself (see callers), the
// call runs on one of the Locker's call goroutines, and goes on there until
// the client gives up or the server answers.
//
// A command given up on may still run on the server: it may be sitting in
// the server's socket. abandoned, if not nil, is called with the late result
// so that the caller can undo what a late success did (an acquisition
// releases the lock it took). It runs in the call's goroutine.
func bounded[T any](ctx context.Context, cs *callers, call func(context.Context) (T, error), abandoned func(T, error)) (T, error) {
	done := ctx.Done()
	if done == nil {
		return call(ctx)
	}
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	if cs.direct(ctx) {
		// The client's socket, pool wait and dial end at ctx's deadline:
		// no goroutine needed. A cancellation before the deadline ends
		// the call only at the deadline, at the latest.
		v, err := call(ctx)
		return v, cs.directErr(ctx, err)
	}
	bc := &boundedCall[T]{ctx: ctx, call: call, abandoned: abandoned, done: make(chan struct{})}
	cs.run(bc)
	select {
	case <-bc.done:
		return bc.v, bc.err
	case <-done:
	}
	bc.mu.Lock()
	defer bc.mu.Unlock()
	select {
	case <-bc.done: // it finished as ctx ended: keep the answer
		return bc.v, bc.err
	default:
	}
	bc.gaveUp = true
	return zero, fmt.Errorf("%w: %w", errGaveUp, ctx.Err())
}

// boundedCall is one call that bounded runs on a call goroutine: one object
// for the call, its result and the hand-over.
type boundedCall[T any] struct {
	ctx       context.Context
	call      func(context.Context) (T, error)
	abandoned func(T, error)

	mu     sync.Mutex
	gaveUp bool          // the caller left; guarded by mu
	done   chan struct{} // closed when v and err are set, unless gaveUp
	v      T
	err    error
}

func (bc *boundedCall[T]) run() {
	v, err := bc.call(bc.ctx)
	bc.mu.Lock()
	if bc.gaveUp {
		bc.mu.Unlock()
		if bc.abandoned != nil {
			bc.abandoned(v, err)
		}
		return
	}
	bc.v, bc.err = v, err
	close(bc.done)
	bc.mu.Unlock()
}

// job is a call handed to a call goroutine.
type job interface{ run() }

// callers runs the calls that bounded must be able to leave: on goroutines
// that wait for the next call for a while after one ends, so that a caller
// whose context has a deadline does not pay for a new goroutine, and for
// growing its stack through go-redis's call path, on every command. An idle
// call goroutine ends after callerIdle, so a Locker still needs no closing.
type callers struct {
	// selfBounded: the client ends its calls at ctx's deadline itself
	// (a plain *redis.Client with ContextTimeoutEnabled), so a ctx with a
	// deadline needs no call goroutine.
	selfBounded bool

	mu   sync.Mutex
	idle []*caller // LIFO: the most recently used has the warmest stack
}

// direct reports whether bounded calls straight through with ctx: it has
// no Done channel, or the client ends the call at its deadline.
func (cs *callers) direct(ctx context.Context) bool {
	if ctx.Done() == nil {
		return true
	}
	_, ok := ctx.Deadline()
	return ok && cs.selfBounded
}

// directErr is err from a call made straight through with ctx: when ctx has
// ended, the error names ctx's too, so that callers treat the call as one
// that may have run (giveUpMaybeHeld). A client that takes its socket
// deadline from ctx (ContextTimeoutEnabled) times out the read at ctx's
// deadline, and may tell it before ctx's own timer has ended ctx: a deadline
// that has passed counts as ended.
func (cs *callers) directErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	cerr := ctx.Err()
	if d, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(d) {
		cerr = context.DeadlineExceeded
	}
	if cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", err, cerr)
	}
	return err
}

// caller is one call goroutine; jobs holds at most the one call handed to
// it by the goroutine that took it off the idle list.
type caller struct{ jobs chan job }

// callerIdle is how long a call goroutine waits for another call;
// maxIdleCallers bounds how many wait.
const (
	callerIdle     = 200 * time.Millisecond
	maxIdleCallers = 64
)

// run runs j on an idle call goroutine, or on a new one.
func (cs *callers) run(j job) {
	cs.mu.Lock()
	if n := len(cs.idle); n > 0 {
		c := cs.idle[n-1]
		cs.idle[n-1] = nil
		cs.idle = cs.idle[:n-1]
		cs.mu.Unlock()
		c.jobs <- j // buffered, and only the taker sends
		return
	}
	cs.mu.Unlock()
	go cs.loop(&caller{jobs: make(chan job, 1)}, j)
}

// loop runs j, then the calls handed to c, until c has waited callerIdle
// for one.
func (cs *callers) loop(c *caller, j job) {
	var idle *time.Timer
	for {
		j.run()
		j = nil
		cs.mu.Lock()
		if len(cs.idle) >= maxIdleCallers {
			cs.mu.Unlock()
			return
		}
		cs.idle = append(cs.idle, c)
		cs.mu.Unlock()
		if idle == nil {
			idle = time.NewTimer(callerIdle)
		} else {
			idle.Reset(callerIdle)
		}
		select {
		case j = <-c.jobs:
			idle.Stop()
			continue
		case <-idle.C:
		}
		cs.mu.Lock()
		if i := slices.Index(cs.idle, c); i >= 0 {
			cs.idle = slices.Delete(cs.idle, i, i+1)
			cs.mu.Unlock()
			return
		}
		cs.mu.Unlock()
		j = <-c.jobs // taken off the list just now: its call is on the way
	}
}

// selfBounded reports whether client ends every call at its context's
// deadline by itself: a plain *redis.Client (not a Sentinel failover
// client, whose master lookup is not bounded so) with ContextTimeoutEnabled,
// which puts the deadline on the socket and on the wait for a pooled
// connection and the dial. Not when the client sets no socket deadlines at
// all (ReadTimeout or WriteTimeout -2, which Options reports as -1 once the
// client is made): then the ctx deadline never reaches the socket either,
// and a hung server holds the call for ever.
func selfBounded(client redis.UniversalClient) bool {
	c, ok := client.(*redis.Client)
	if !ok {
		return false
	}
	o := c.Options()
	return o.ContextTimeoutEnabled && o.Addr != "FailoverClient" && o.ReadTimeout >= 0 && o.WriteTimeout >= 0
}

// errGaveUp wraps ctx's error when bounded stopped waiting for a call that
// is still running: its abandoned callback deals with a late result, so the
// caller need not.
var errGaveUp = errors.New("redislock: stopped waiting for the reply")

// synced is evalSyncedOr's result: the script's reply and the replica
// acknowledgements.
type synced struct {
	reply           *redis.Cmd
	acked, required int
}

// evalBounded is evalSyncedOr, with WAIT, through bounded.
func (l *Locker) evalBounded(ctx context.Context, abandoned func(synced, error), script *redis.Script, keys skeys, args ...any) (synced, error) {
	return l.evalBoundedOr(ctx, false, abandoned, script, keys, args...)
}

// evalBoundedOr is evalSyncedOr through bounded.
func (l *Locker) evalBoundedOr(ctx context.Context, noWait bool, abandoned func(synced, error), script *redis.Script, keys skeys, args ...any) (synced, error) {
	if l.calls.direct(ctx) {
		// No closure for bounded, which would call straight through.
		reply, acked, required, err := l.evalSyncedOr(ctx, noWait, script, keys, args...)
		return synced{reply, acked, required}, l.calls.directErr(ctx, err)
	}
	return bounded(ctx, &l.calls, func(ctx context.Context) (synced, error) {
		reply, acked, required, err := l.evalSyncedOr(ctx, noWait, script, keys, args...)
		return synced{reply, acked, required}, err
	}, abandoned)
}
