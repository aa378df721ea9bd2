package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// TestKeptConfirmTakeGivenBackBeforeReturn: 8c36447 gives a kept lock
// back before the waiting Acquire returns (its `fail` waits for the
// withdrawal), but only in the wait loop. A first try sent without WAIT
// (another Acquire of the Locker waits for the lock) that takes it is
// confirmed by a synced try, which finds the lock its own (acquire.lua's
// four-element reply) and, refused by replica sync, keeps it (tryOr's
// kept path, as for a grant); when keep.lua's call then fails (its read
// times out: errUnreleased), the first try's error path
// (giveUpMaybeHeld) gives the lock back in the background, and Acquire
// returns ErrNotReplicated with the lock still its owner's. Here the
// give-back is held on its way until Acquire returns or a second passes.
func TestKeptConfirmTakeGivenBackBeforeReturn(t *testing.T) {
	const name = "lock:kept-first-try"
	lock := lockKey(name)
	srv := redistest.Start(t)
	replica := redistest.StartReplica(t, srv)
	redistest.WaitReplicated(t, srv, 1)
	admin := srv.Client(t)
	if err := acquire(t, lockerWith(t, admin, redislock.Options{}), "lock:warm-up").Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	// keep.lua's call (one key: the lock) fails; the give-back
	// (release.lua) is held on its way (no read timeout ends it).
	back := &transit{match: fmt.Appendf(nil, "$1\r\n%d\r\n$%d\r\n%s\r\n", redislock.ReleaseKeys, len(lock), lock)}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: back.dial, ReadTimeout: -1, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	keep := &failKeep{lock: lock}
	c.AddHook(keep)
	sync := redislock.ReplicaSync{Replicas: 1, Timeout: 200 * time.Millisecond}
	holder := acquire(t, lockerWith(t, admin, redislock.Options{ReplicaSync: sync}), name, fence.TTL(time.Minute))
	l := lockerWith(t, c, redislock.Options{ReplicaSync: sync})

	// Another Acquire of l waits for the lock.
	wctx, wcancel := context.WithCancel(ctx(t))
	defer wcancel()
	other := make(chan error, 1)
	go func() {
		ls, err := l.Acquire(wctx, name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			_ = ls.Release(context.Background())
		}
		other <- err
	}()
	waitFor(t, func() bool {
		return admin.LLen(ctx(t), lock+":queue").Val() == 1 && subscribers(t, admin, name) == 1 && redislock.OthersWait(l, name, "")
	})
	// The lock and its queue lost (a failover to a replica that had
	// neither): the waiter, not told, waits for its timer.
	if err := admin.Del(ctx(t), lock, lock+":queue", lock+":waiters").Err(); err != nil {
		t.Fatal(err)
	}
	_ = holder

	resume := replica.Pause(t)
	resumed := false
	defer func() {
		if !resumed {
			resume()
		}
	}()
	keep.arm()
	back.arm()
	got := make(chan acquired, 1)
	go func() {
		ls, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		got <- acquired{ls, err}
	}()
	waitFor(t, back.holding)
	owner := admin.Get(ctx(t), lock).Val()
	var r acquired
	early := false
	select {
	case r = <-got:
		early = true
	case <-time.After(time.Second):
	}
	kept := keep.failed.Load()
	back.mu.Lock()
	heldReq := string(back.data)
	back.mu.Unlock()
	if err := back.deliver(); err != nil {
		t.Fatal(err)
	}
	if !early {
		r = <-got
	}
	resume()
	resumed = true
	if r.lease != nil {
		t.Fatalf("Acquire returned a lease (token %d) with its replica paused", r.lease.Token())
	}
	if !errors.Is(r.err, fence.ErrNotReplicated) {
		t.Fatalf("Acquire = %v, want ErrNotReplicated", r.err)
	}
	t.Logf("Acquire: %v", r.err)
	if !kept {
		t.Fatalf("keep.lua's call was not failed when the give-back was held (%q; Acquire: %v): the first try's confirmation did not keep the lock", heldReq, r.err)
	}
	if early {
		t.Errorf("Acquire returned %v with its kept lock (owner %q) still its own: the give-back was on its way, not waited for", r.err, owner)
	}
	wcancel()
	<-other
	if err := l.WaitGiveBacks(ctx(t)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return admin.Exists(ctx(t), lock).Val() == 0 })
}

// failKeep fails keep.lua's calls on lock (EVALSHA or EVAL with the lock
// as its one key) once armed.
type failKeep struct {
	lock   string
	armed  atomic.Bool
	failed atomic.Bool
}

func (h *failKeep) arm() { h.armed.Store(true) }

func (h *failKeep) isKeep(cmd redis.Cmder) bool {
	args := cmd.Args()
	return h.armed.Load() && len(args) > 3 && fmt.Sprint(args[2]) == "1" && fmt.Sprint(args[3]) == h.lock
}

func (h *failKeep) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failKeep) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.isKeep(cmd) {
			h.failed.Store(true)
			err := errors.New("failKeep: keep.lua's call failed")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *failKeep) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if h.isKeep(cmd) {
				h.failed.Store(true)
				err := errors.New("failKeep: keep.lua's call failed")
				for _, c := range cmds {
					c.SetErr(err)
				}
				return err
			}
		}
		return next(ctx, cmds)
	}
}
