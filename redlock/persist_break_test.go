package redlock_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// TestReleaseOnRestartingPersistentNode: the nodes keep AOF with
// appendfsync always, as the package doc asks of a node that may restart.
// A Release runs while node 2 is down (restarting, longer than go-redis's
// own dial retries): it returns nil, decided by nodes 0 and 1, and its
// delete on node 2 ends with a refused connection, which ends the
// background retries ("the node is down, and the try with it"). Node 2
// comes back from its AOF with the released lease's lock and keeps it for
// the whole lease time. Node 1 then goes down: nodes 0 and 2, a majority,
// are free of any live lease, yet every Acquire fails (before: "held by
// another owner: on 1 of 3 nodes" for the 5 s waited, of a 30 s lease; a
// Close made after the Release returned nil, its work done). A failed try's
// give-back and revokeTry follow the same ECONNREFUSED rule.
//
// The fix I would choose: retry past a refused connection, within the
// lease time, as for any other error (tried: this test then passes in
// 1.3 s). It is more than local: Close then waits, up to its context, for
// every release on a node that is down, with or without persistence
// (a Close with context.Background took the lease time, 30 s, in the
// trial), and reports a *CloseError where it returns nil now; a Locker
// left unclosed keeps a goroutine per such release for the lease time.
// Whether to do that always, only for nodes whose INFO persistence shows
// AOF or RDB at first contact, or to document the window instead, is a
// design decision.
func TestReleaseOnRestartingPersistentNode(t *testing.T) {
	t.Skip("design question: a release refused by a node that is down is never retried, " +
		"and a node that restarts with AOF keeps the released lock for the lease time " +
		"(the next Acquire fails on a free majority); retrying past ECONNREFUSED changes Close's contract")
	srvs := make([]*redistest.Server, 3)
	for i := range srvs {
		srvs[i] = redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	}
	const name, ttl = "release-persistent-restart", 30 * time.Second
	// Node 2's client tells when a script call there ends refused.
	refused := make(chan struct{}, 100)
	hooks := []redis.Hook{nil, nil, refusedHook(refused)}
	cs := clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}, hooks...)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	other := newLocker(t, srvs, &redlock.Options{NodeTimeout: generous, RetryDelay: 50 * time.Millisecond})
	lease, err := l.Acquire(ctxFor(t), name, fence.TTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	srvs[2].Kill()
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release with node 2 down: %v", err)
	}
	select {
	case <-refused:
	case <-time.After(5 * time.Second):
		t.Fatal("the Release's delete on node 2 did not end refused within 5 s")
	}
	srvs[2].Restart(t) // from its AOF, with the released lease's lock
	srvs[1].Kill()
	ctx, cancel := context.WithTimeout(ctxFor(t), 7*time.Second)
	defer cancel()
	next, err := other.Acquire(ctx, name, fence.TTL(ttl), fence.Wait(5*time.Second))
	if err != nil {
		t.Fatalf("Acquire on nodes 0 and 2, free of any live lease, for 5 s after the release: %v (held: %v; locked on node 2: %v)",
			err, errors.Is(err, fence.ErrHeld), len(lockedOn(t, srvs[2:], name)) == 1)
	}
	if next.Token() <= lease.Token() {
		t.Errorf("token %d after %d", next.Token(), lease.Token())
	}
	_ = next.Release(ctxFor(t))
}

// refusedHook is a go-redis hook that signals on its channel when a script
// call (EVALSHA, EVAL) ends with a refused connection, once go-redis's own
// dial retries are over.
type refusedHook chan struct{}

func (h refusedHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h refusedHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if strings.HasPrefix(cmd.Name(), "eval") && errors.Is(err, syscall.ECONNREFUSED) {
			select {
			case h <- struct{}{}:
			default:
			}
		}
		return err
	}
}

func (h refusedHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
