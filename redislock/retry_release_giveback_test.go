package redislock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// lostExtendReply makes the next extend script, once armed, run on the
// server and then fail as if its reply were lost.
type lostExtendReply struct{ armed atomic.Bool }

func (h *lostExtendReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lostExtendReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *lostExtendReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && numKeys(cmd) == 1 && h.armed.CompareAndSwap(true, false) {
			err = errors.New("injected: extend reply lost")
			cmd.SetErr(err)
		}
		return err
	}
}

// A lease whose Extend lost its reply (the lock's expiry may have moved
// ahead of the Deadline) is released with a done ctx: that Release sends
// nothing, but the lease gives the lock back in the background. A Release
// retried after that give-back finds the lock gone by the lease's own
// delete, nothing lost: it must return nil, as after a failed delete of
// its own. Before the fix the give-back did not count as a delete that may
// have run, and the retry said "fence: lease lost: ... was removed or
// taken by another owner".
func TestRetriedReleaseAfterOwnGiveBack(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	h := &lostExtendReply{}
	c := srv.Client(t)
	c.AddHook(h)
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "retried-release-after-give-back"
	ls := acquire(t, l, name, fence.TTL(30*time.Second))
	h.armed.Store(true)
	if err := ls.Extend(ctx(t), time.Minute); err == nil {
		t.Fatal("Extend with its reply lost = nil")
	}
	if err := ls.Err(); err != nil {
		t.Fatalf("the lease ended after an Extend that lost its reply: %v", err)
	}
	done, cancel := context.WithCancel(ctx(t))
	cancel()
	first := ls.Release(done)
	if !errors.Is(first, context.Canceled) {
		t.Fatalf("Release with a done ctx = %v, want context.Canceled", first)
	}
	// The give-back, the lease's own, deletes the lock in the background.
	waitFor(t, func() bool { return admin.Exists(ctx(t), lockKey(name)).Val() == 0 })
	if err := ls.Release(ctx(t)); err != nil {
		t.Fatalf("Release retried after the lease's own give-back (the first: %v) = %v, want nil", first, err)
	}
}
