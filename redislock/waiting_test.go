package redislock_test

import (
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
)

// TestReleasePublishesOnlyWhenWaited: a release that nobody waits for sends
// nothing on the lock's channel; once an Acquire of another Locker (as of
// another process) has found the lock held and waits, the release tells it,
// and it takes the lock long before the holder's minute-long TTL would have
// freed it. A marker published after each release shows what came first.
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
	waitFor(t, func() bool { return admin.Exists(ctx(t), lockKey(name)+":waiting").Val() == 1 })
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	marker()
	if got := next(); got != "released" {
		t.Fatalf("a release with a waiter: first message %q, want \"released\"", got)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the waiter took %v, as if it had waited for the holder's TTL", took)
	}
}
