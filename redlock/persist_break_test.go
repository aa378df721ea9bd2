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
	"go.uber.org/goleak"
)

// TestReleaseOnRestartingPersistentNode: the nodes keep AOF with
// appendfsync always, as the package doc asks of a node that may restart.
// A Release runs while node 2 is down (restarting, longer than go-redis's
// own dial retries): it returns nil, decided by nodes 0 and 1, and its
// delete on node 2 ends with a refused connection. That ended the
// background retries ("the node is down, and the try with it"): node 2
// came back from its AOF with the released lease's lock and kept it for
// the whole lease time, and with node 1 then down, nodes 0 and 2, a
// majority free of any live lease, refused every Acquire ("held by another
// owner: on 1 of 3 nodes" for the 5 s waited, of a 30 s lease). A release
// refused is now retried while the Locker is open, within the lease time,
// and Close ends those retries without waiting for them
// (TestCloseEndsParkedRetries).
func TestReleaseOnRestartingPersistentNode(t *testing.T) {
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

// TestCloseEndsParkedRetries: a release that node 2 refused (down for
// good) is retried in the background; Close neither waits for that retry
// nor reports it: it returns nil well before its context ends, and ends
// the retry: its goroutine is gone while the clients are still open (a
// retry left running would go on for the lease time).
func TestCloseEndsParkedRetries(t *testing.T) {
	srvs := make([]*redistest.Server, 3)
	for i := range srvs {
		srvs[i] = redistest.Start(t)
	}
	refused := make(chan struct{}, 100)
	hooks := []redis.Hook{nil, nil, refusedHook(refused)}
	cs := clientsWith(t, srvs, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1}, hooks...)
	l, err := redlock.New(cs, &redlock.Options{NodeTimeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctxFor(t), "close-parked", fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	before := goleak.IgnoreCurrent() // the servers' own, among others
	srvs[2].Kill()
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatalf("Release with node 2 down: %v", err)
	}
	select {
	case <-refused:
	case <-time.After(5 * time.Second):
		t.Fatal("the Release's delete on node 2 did not end refused within 5 s")
	}
	ctx, cancel := context.WithTimeout(ctxFor(t), 20*time.Second)
	defer cancel()
	if err := l.Close(ctx); err != nil {
		t.Fatalf("Close with a release parked on a node down: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Close waited until its context ended")
	}
	if err := goleak.Find(before); err != nil {
		t.Fatalf("after Close, with the clients open: %v", err)
	}
}
