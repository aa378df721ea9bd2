package redislock

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestForeignGrantBeforeJoin: a waiter's try queues it behind a waiter
// whose process died, and the try's reply is late; meanwhile the holder
// releases, and the lock is granted to the dead waiter for what was left
// of its budget. The grant reaches the Locker's subscription (another
// Acquire of the Locker waits on it) before the late waiter has joined, so
// it moves no timer of the late waiter's, whose try's reply then gives the
// old holder's TTL (a minute). When the dead waiter's grant ends nobody
// releases, and the late waiter slept until its budget ended (ErrHeld)
// with the lock free. CI saw it under load in the end-to-end form
// (TestDeadWaiterBlocksNoLongerThanItsBudget: "held by another owner"
// after 20 s). It must try when that grant ends.
func TestForeignGrantBeforeJoin(t *testing.T) {
	t.Parallel() // own server, no package state changed; mostly waits out grants
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := srv.Client(t)
	const name = "lock:grant-window"
	opts := &Options{ReplicaSync: ReplicaSync{Disabled: true}}
	holders, err := New(srv.Client(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	holder, err := holders.Acquire(ctx, name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	k := holders.keys(name)
	queued := func(n int64) func() bool {
		return func() bool { return admin.LLen(ctx, k.queue).Val() == n }
	}

	// The dead waiter: queued, then its client closed (it cannot withdraw).
	deadClient := redis.NewClient(&redis.Options{Addr: srv.Addr})
	dead, err := New(deadClient, opts)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { _, _ = dead.Acquire(ctx, name, fence.Wait(4*time.Second), fence.TTL(time.Minute)) })
	eventually(t, queued(1))
	_ = deadClient.Close()

	c := srv.Client(t)
	stall := &replyStall{key: k.lock, open: make(chan struct{})}
	var once sync.Once
	opened := func() { once.Do(func() { close(stall.open) }) }
	t.Cleanup(opened)
	c.AddHook(stall)
	l, err := New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	// keeper keeps the Locker's subscription; it leaves once the late
	// waiter has joined, before the dead waiter's grant ends, so that
	// nobody but the late waiter would try then.
	kctx, kcancel := context.WithCancel(ctx)
	defer kcancel()
	wg.Go(func() { _, _ = l.Acquire(kctx, name, fence.Wait(20*time.Second), fence.TTL(time.Minute)) })
	// Its two tries (before and after the subscription) have had their
	// replies: armed while the second's was on its way back, the stall
	// would catch that one instead of the late waiter's.
	eventually(t, func() bool {
		return queued(2)() && admin.PubSubNumSub(ctx, k.channel).Val()[k.channel] == 1 && stall.replies() >= 2
	})

	stall.arm()
	late := make(chan error, 1)
	wg.Go(func() {
		ls, err := l.Acquire(ctx, name, fence.Wait(12*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = ls.Release(ctx)
		}
		late <- err
	})
	eventually(t, queued(3)) // its try ran; its reply is held
	released := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	sub := func() *subscription {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.subscriptions[k.channel]
	}
	eventually(t, func() bool { // the grant to the dead waiter reached the subscription
		w := sub()
		l.mu.Lock()
		defer l.mu.Unlock()
		return w != nil && !w.last.seen.IsZero()
	})
	opened()
	eventually(t, func() bool { // the late waiter has joined
		w := sub()
		l.mu.Lock()
		defer l.mu.Unlock()
		return w != nil && len(w.waiters) == 2
	})
	// The late waiter's timer: no later than the dead waiter's grant's end
	// (within 4 s of the release), not the old holder's TTL (a minute).
	var until time.Time
	eventually(t, func() bool {
		w := sub()
		l.mu.Lock()
		defer l.mu.Unlock()
		if w == nil || len(w.waiters) != 2 {
			return false
		}
		until = w.waiters[1].until // the keeper came first
		return !until.IsZero()
	})
	if d := until.Sub(released); d > 5*time.Second {
		t.Errorf("the late waiter's timer fires %v after the release, with the lock granted to the dead waiter for less than 4 s", d.Round(time.Millisecond))
	}
	kcancel()
	select {
	case err := <-late:
		if err != nil {
			t.Fatalf("the late waiter, %v after the release: %v", time.Since(released).Round(time.Millisecond), err)
		}
		if took := time.Since(released); took > 7*time.Second {
			t.Errorf("the late waiter got the lock %v after the release; the dead waiter's grant ended within 4 s", took.Round(time.Millisecond))
		}
	case <-ctx.Done():
		t.Fatal("the late waiter never returned")
	}
}
