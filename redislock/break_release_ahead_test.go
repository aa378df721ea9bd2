package redislock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// aheadHook holds the reply of the next extend script once armed (it has
// run on the server), and makes the next release script (sent in a
// pipeline) wait for a signal and then fail without being sent.
type aheadHook struct {
	holdExtend, failRelease atomic.Bool
	extendRan, extendGo     chan struct{}
	releaseAt, releaseGo    chan struct{}
}

// numKeys is a script call's key count: extend.lua takes 1, release.lua ReleaseKeys.
func numKeys(cmd redis.Cmder) int64 {
	args := cmd.Args()
	if len(args) < 3 {
		return -1
	}
	switch n := args[2].(type) {
	case int:
		return int64(n)
	case int64:
		return n
	}
	return -1
}

func (h *aheadHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *aheadHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && numKeys(cmds[0]) == redislock.ReleaseKeys && h.failRelease.CompareAndSwap(true, false) {
			close(h.releaseAt)
			<-h.releaseGo
			err := errors.New("injected: release not sent")
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}
func (h *aheadHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if numKeys(cmd) == redislock.ReleaseKeys && h.failRelease.CompareAndSwap(true, false) {
			close(h.releaseAt)
			<-h.releaseGo
			err := errors.New("injected: release not sent")
			cmd.SetErr(err)
			return err
		}
		err := next(ctx, cmd)
		if err == nil && numKeys(cmd) == 1 && h.holdExtend.CompareAndSwap(true, false) {
			close(h.extendRan)
			<-h.extendGo
		}
		return err
	}
}

// An Extend whose script moved the lock's expiry far ahead, its reply read
// while a Release is in flight (the lease ended as Release started), and
// that Release then fails: the lock, held by nobody, is given back at once
// rather than kept for the Extend's TTL. Also with the Release failing
// first and the Extend's reply read after.
func TestReleaseFailsAfterRenewalMovedLockAhead(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	for _, extendFirst := range []bool{true, false} {
		name := "ahead-release-fails"
		if extendFirst {
			name += "-extend-reply-first"
		}
		t.Run(name, func(t *testing.T) {
			h := &aheadHook{extendRan: make(chan struct{}), extendGo: make(chan struct{}),
				releaseAt: make(chan struct{}), releaseGo: make(chan struct{})}
			c := srv.Client(t)
			c.AddHook(h)
			rec := &observetest.Recorder{}
			l := lockerWith(t, c, redislock.Options{Observer: rec, ReplicaSync: redislock.ReplicaSync{Disabled: true}})
			ls := acquire(t, l, name, fence.TTL(2*time.Second))
			h.holdExtend.Store(true)
			extended := make(chan error, 1)
			go func() { extended <- ls.Extend(ctx(t), 10*time.Minute) }()
			<-h.extendRan // the lock now expires 10 minutes on
			h.failRelease.Store(true)
			released := make(chan error, 1)
			go func() { released <- ls.Release(ctx(t)) }()
			<-h.releaseAt // the lease has ended; the release is not sent yet
			if extendFirst {
				close(h.extendGo)
				t.Logf("Extend = %v", <-extended)
				close(h.releaseGo)
				t.Logf("Release = %v", <-released)
			} else {
				close(h.releaseGo)
				t.Logf("Release = %v", <-released)
				close(h.extendGo)
				t.Logf("Extend = %v", <-extended)
			}
			if ls.Err() == nil {
				t.Fatal("the lease is held after Release")
			}
			waitFor(t, func() bool { return admin.Exists(ctx(t), lockKey(name)).Val() == 0 })
			if ends := rec.WaitEnds(t, 1, 5*time.Second); len(ends) != 1 || ends[0].Cause != fence.Released {
				t.Errorf("ends reported %+v, want one Released", ends)
			}
		})
	}
}

// A Release given the lease's own Context, on a hung server, by a client
// that sets no socket deadlines: the lease's end (as Release starts) does
// not cancel the release script, but the call still ends by the lease's
// deadline, as the lease's expiry ended that context before Release ended
// the lease first. Unbounded, it would wait for the server for ever.
func TestReleaseWithLeaseContextOnHungServerEnds(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: -2, WriteTimeout: -2})
	t.Cleanup(func() { _ = c.Close() })
	l := lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	ls := acquire(t, l, "hung-release", fence.TTL(time.Second))
	resume := srv.Pause(t)
	defer resume()
	done := make(chan error, 1)
	go func() { done <- ls.Release(ls.Context()) }()
	select {
	case err := <-done:
		t.Logf("Release = %v", err)
		if err == nil {
			t.Error("Release on a hung server = nil")
		}
	case <-time.After(time.Until(ls.Deadline()) + 5*time.Second):
		resume()
		t.Errorf("Release still running 5 s past the lease's deadline")
		<-done
	}
}
