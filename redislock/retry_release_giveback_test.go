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

// heldRenewal holds the next extend script, once armed, after it ran on
// the server until let go, and then fails it as if its reply were lost.
type heldRenewal struct {
	armed     atomic.Bool
	ran, lose chan struct{}
}

func (h *heldRenewal) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *heldRenewal) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *heldRenewal) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && numKeys(cmd) == 1 && h.armed.CompareAndSwap(true, false) {
			close(h.ran)
			<-h.lose
			err = errors.New("injected: renewal reply lost")
			cmd.SetErr(err)
		}
		return err
	}
}

// As TestRetriedReleaseAfterOwnGiveBack, with the give-back started by
// the watchdog's renewal: a Release with a done ctx gives up on the
// renewal under way, sending nothing; that renewal then loses its reply
// (it moved the lock's expiry ahead), and the lease gives the lock back.
// A Release retried after that must return nil. Before the fix it said
// "fence: lease lost: ... was removed or taken by another owner".
func TestRetriedReleaseAfterRenewalGiveBack(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	h := &heldRenewal{ran: make(chan struct{}), lose: make(chan struct{})}
	c := srv.Client(t)
	c.AddHook(h)
	l := lockerWith(t, c, redislock.Options{WatchdogTTL: 3 * time.Second, ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	const name = "retried-release-after-renewal-give-back"
	h.armed.Store(true)
	ls := acquire(t, l, name) // a watchdog lease: renewed every second
	select {
	case <-h.ran:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal within 10 s")
	}
	done, cancel := context.WithCancel(ctx(t))
	cancel()
	first := ls.Release(done)
	if !errors.Is(first, context.Canceled) {
		t.Fatalf("Release with a done ctx, a renewal under way = %v, want context.Canceled", first)
	}
	close(h.lose)
	// The give-back, the lease's own, deletes the lock in the background.
	waitFor(t, func() bool { return admin.Exists(ctx(t), lockKey(name)).Val() == 0 })
	if err := ls.Release(ctx(t)); err != nil {
		t.Fatalf("Release retried after the lease's own give-back (the first: %v) = %v, want nil", first, err)
	}
}
