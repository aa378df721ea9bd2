package redislock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
)

// TestReleasePublishesOnlyWhenWaited: a release that nobody waits for sends
// nothing on the lock's channel; once an Acquire of another Locker (as of
// another process) has found the lock held and queued, the release grants
// it the lock and says so, and it has the lock long before the holder's
// minute-long TTL would have freed it. A marker published after each
// release shows what came first.
func TestReleasePublishesOnlyWhenWaited(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:payment:1001"
	ch := lockKey(name) + ":released"
	ps := admin.Subscribe(ctx(t), ch)
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(ctx(t)); err != nil { // the confirmation
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		msg, err := ps.ReceiveMessage(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		return msg.Payload
	}
	marker := func() {
		t.Helper()
		if err := admin.Publish(ctx(t), ch, "marker").Err(); err != nil {
			t.Fatal(err)
		}
	}

	holder, waiter := newLocker(t, srv.Client(t)), newLocker(t, srv.Client(t))
	lease := acquire(t, holder, name, fence.TTL(time.Minute))
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	marker()
	if got := next(); got != "marker" {
		t.Fatalf("a release nobody waited for published %q", got)
	}

	lease = acquire(t, holder, name, fence.TTL(time.Minute))
	got := make(chan error, 1)
	start := time.Now()
	go func() {
		l, err := waiter.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			err = l.Release(ctx(t))
		}
		got <- err
	}()
	waitFor(t, func() bool { return admin.LLen(ctx(t), lockKey(name)+":queue").Val() == 1 })
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	marker()
	if got := next(); !strings.HasPrefix(got, "g ") {
		t.Fatalf("a release with a waiter: first message %q, want a grant", got)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the waiter took %v, as if it had waited for the holder's TTL", took)
	}
}

// TestShortWaiterLeavesQueue: a waiter with a short budget, whether it
// comes before or after one with a long budget, leaves the queue when it
// gives up, and the long one stays: a release grants the lock to the long
// one, long before the holder's minute-long TTL.
func TestShortWaiterLeavesQueue(t *testing.T) {
	for _, shortFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "short-first", false: "long-first"}[shortFirst], func(t *testing.T) {
			srv := redistest.Start(t)
			admin := srv.Client(t)
			const name = "lock:payment:1001"
			queue := lockKey(name) + ":queue"
			live := func() int { return int(admin.HLen(ctx(t), lockKey(name)+":waiters").Val()) }
			holder := newLocker(t, srv.Client(t))
			lease := acquire(t, holder, name, fence.TTL(time.Minute))
			short := func() {
				_, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(300*time.Millisecond), fence.TTL(time.Minute))
				if !errors.Is(err, fence.ErrHeld) {
					t.Errorf("the short waiter: %v, want ErrHeld", err)
				}
			}
			if shortFirst {
				short()
			}
			got := make(chan error, 1)
			go func() {
				l, err := newLocker(t, srv.Client(t)).Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
				if err == nil {
					err = l.Release(ctx(t))
				}
				got <- err
			}()
			waitFor(t, func() bool { return live() >= 1 && admin.PTTL(ctx(t), queue).Val() > 10*time.Second })
			if !shortFirst {
				short()
			}
			waitFor(t, func() bool { return live() == 1 }) // the short one withdrew
			if ttl := admin.PTTL(ctx(t), queue).Val(); ttl < 10*time.Second {
				t.Fatalf("the queue has %v left after the short waiter, want the long one's budget", ttl)
			}
			start := time.Now()
			if err := lease.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("the long waiter: %v", err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("the long waiter took %v after the release, as if nobody told it", took)
			}
		})
	}
}
