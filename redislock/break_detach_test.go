package redislock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// A Release that failed (here: a done ctx) has ended the lease, and
// cancelled its Context with ErrReleased; calling Release again retries,
// also with that Context: its end must not cut the retry short.
func TestReleaseRetryWithLeaseContext(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	l := lockerWith(t, srv.Client(t), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	name := "detach-retry"
	ls := acquire(t, l, name, fence.TTL(time.Minute))
	lctx := ls.Context()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ls.Release(done); err == nil {
		t.Fatal("Release with a done ctx = nil")
	}
	if context.Cause(lctx) != fence.ErrReleased {
		t.Fatalf("Context's cause %v", context.Cause(lctx))
	}
	if err := ls.Release(lctx); err != nil {
		t.Errorf("Release retried with the lease's Context = %v", err)
	}
	if n := admin.Exists(ctx(t), lockKey(name)).Val(); n != 0 {
		t.Errorf("lock still held after the retry")
	}
}

// holdRelease holds the next release script (ReleaseKeys keys) until released.
type holdRelease struct {
	armed    atomic.Bool
	at, free chan struct{}
}

func (h *holdRelease) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && numKeys(cmds[0]) == redislock.ReleaseKeys && h.armed.CompareAndSwap(true, false) {
			close(h.at)
			<-h.free
		}
		return next(ctx, cmds)
	}
}
func (h *holdRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if numKeys(cmd) == redislock.ReleaseKeys && h.armed.CompareAndSwap(true, false) {
			close(h.at)
			<-h.free
		}
		return next(ctx, cmd)
	}
}

// A second Release given the lease's Context while the first is in flight:
// the first's end of the lease (as it started) must not make the second
// give up waiting for it with a spurious "context canceled"; it returns the
// first's result.
func TestConcurrentReleaseWithLeaseContext(t *testing.T) {
	srv := redistest.Start(t)
	h := &holdRelease{at: make(chan struct{}), free: make(chan struct{})}
	c := srv.Client(t)
	c.AddHook(h)
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	ls := acquire(t, l, "detach-concurrent", fence.TTL(time.Minute))
	lctx := ls.Context()
	h.armed.Store(true)
	first := make(chan error, 1)
	go func() { first <- ls.Release(ctx(t)) }()
	<-h.at // the lease has ended; the script is held
	second := make(chan error, 1)
	go func() { second <- ls.Release(lctx) }()
	select {
	case err := <-second:
		close(h.free)
		<-first
		t.Fatalf("second Release returned while the first was in flight: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(h.free)
	if err := <-first; err != nil {
		t.Fatalf("first Release = %v", err)
	}
	if err := <-second; err != nil {
		t.Errorf("second Release = %v, want the first's nil", err)
	}
}
