package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
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
// here instead. The call goes on in its goroutine until the client gives up
// or the server answers; the goroutine then ends.
//
// A command given up on may still run on the server: it may be sitting in
// the server's socket. abandoned, if not nil, is called with the late result
// so that the caller can undo what a late success did (an acquisition
// releases the lock it took). It runs in the call's goroutine.
func bounded[T any](ctx context.Context, call func(context.Context) (T, error), abandoned func(T, error)) (T, error) {
	if ctx.Done() == nil {
		return call(ctx)
	}
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	type result struct {
		v   T
		err error
	}
	var (
		mu     sync.Mutex
		gaveUp bool
		done   = make(chan result, 1)
	)
	go func() {
		v, err := call(ctx)
		mu.Lock()
		if gaveUp {
			mu.Unlock()
			if abandoned != nil {
				abandoned(v, err)
			}
			return
		}
		done <- result{v, err}
		mu.Unlock()
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case r := <-done: // it finished as ctx ended: keep the answer
		return r.v, r.err
	default:
	}
	gaveUp = true
	return zero, fmt.Errorf("%w: %w", errGaveUp, ctx.Err())
}

// errGaveUp wraps ctx's error when bounded stopped waiting for a call that
// is still running: its abandoned callback deals with a late result, so the
// caller need not.
var errGaveUp = errors.New("redislock: stopped waiting for the reply")

// synced is evalSynced's result: the script's reply and the replica
// acknowledgements.
type synced struct {
	reply           *redis.Cmd
	acked, required int
}

// evalBounded is evalSynced through bounded.
func (l *Locker) evalBounded(ctx context.Context, abandoned func(synced, error), script *redis.Script, keys []string, args ...any) (synced, error) {
	return bounded(ctx, func(ctx context.Context) (synced, error) {
		reply, acked, required, err := l.evalSynced(ctx, script, keys, args...)
		return synced{reply, acked, required}, err
	}, abandoned)
}

// revokeFor is how long the mark that revokes an acquisition given up on
// lives (release.lua). The acquisition and the revocation were both sent
// before the give-up returned, so on a server that was paused or slow they
// run within moments of each other; an acquire command delayed in transit
// for longer than this can still take the lock, for its lease time.
const revokeFor = time.Minute

// releaseAbandoned gives back a lock that an acquisition given up on took
// or may still take, owner-checked: it deletes the lock if the acquisition
// ran, and revokes the owner either way, so that any of its acquisitions
// that runs later refuses. A try that fails on the way (the server still
// paused, the pool exhausted) is retried with back-off within the lease
// time: the acquisition may still be sitting in the server's socket, and
// unrevoked it would take the lock for a lease that nobody holds. A refused
// connection ends it: the server that could have run the acquisition is
// gone, and the acquisition with it.
func (l *Locker) releaseAbandoned(a attempt) {
	ctx, cancel := context.WithTimeout(context.Background(), max(a.ttl, time.Second))
	defer cancel()
	for failures := 1; ; failures++ {
		_, err := l.releaseOwned(ctx, &a, max(a.ttl, revokeFor))
		if err == nil || !transient(err) || errors.Is(err, syscall.ECONNREFUSED) || ctx.Err() != nil {
			return
		}
		if !pause(ctx, retryBackoff(failures)) {
			return
		}
	}
}
