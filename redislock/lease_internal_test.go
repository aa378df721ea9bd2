package redislock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
)

// TestRenewalAfterDeadlineRefusedByScript isolates extend.lua's rule from
// the late reply's clean-up (which releases a lock that a late renewal moved
// after the lease ended, and so hides the rule in the paused-server test):
// the lease's mapping from local to server time is moved so that its
// deadline on the server's clock lies two minutes in the past, as if the
// renewal had sat that long in the server's socket. The script must refuse
// it and leave the lock's expiry alone, and the lease must end. A renewal
// well within the deadline is accepted.
func TestRenewalAfterDeadlineRefusedByScript(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	admin := srv.Client(t)
	for _, late := range []bool{false, true} {
		fl, err := l.Acquire(ctx, "lock:payment:1001", fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		ls := fl.(*lease)
		if err := admin.PExpire(ctx, ls.attempt.keys.lock, 5*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		if late {
			ls.mu.Lock()
			ls.serverAt -= (2 * time.Minute).Milliseconds()
			ls.mu.Unlock()
		}
		err = ls.Extend(ctx, time.Minute)
		pttl := admin.PTTL(ctx, ls.attempt.keys.lock).Val()
		switch {
		case !late && (err != nil || pttl <= 5*time.Second):
			t.Fatalf("renewal in time: Extend = %v, lock TTL %v; want nil and about a minute", err, pttl)
		case late && !errors.Is(err, fence.ErrLeaseLost):
			t.Fatalf("renewal after the deadline: Extend = %v, want ErrLeaseLost", err)
		case late && pttl > 5*time.Second:
			t.Fatalf("renewal after the deadline moved the lock's TTL to %v", pttl)
		case late && ls.Err() == nil:
			t.Fatal("the lease goes on after its renewal was refused as late")
		}
		_ = ls.Release(ctx)
	}
}

// TestLazyLeaseEndsAtDeadline: a fixed-TTL lease that nobody watches has
// no context and no timer until Context or Done is called, yet it must end
// at its deadline as if it had them: Err reports the loss, and Done, even
// called only after the deadline, is closed at once with the loss as the
// context's cause. One whose Done is called in time closes at its deadline.
func TestLazyLeaseEndsAtDeadline(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	acquire := func(ttl time.Duration) *lease {
		t.Helper()
		fl, err := l.Acquire(ctx, "lock:payment:1001", fence.TTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		ls := fl.(*lease)
		ls.mu.Lock()
		defer ls.mu.Unlock()
		if ls.ctx != nil || ls.expiry != nil {
			t.Fatal("an unwatched fixed-TTL lease has a context or timer before Done or Context was called")
		}
		return ls
	}
	pastDeadline := func(ls *lease) {
		ls.mu.Lock()
		ls.deadline = time.Now().Add(-time.Millisecond)
		ls.mu.Unlock()
	}
	closed := func(ls *lease) {
		t.Helper()
		select {
		case <-ls.Done():
		default:
			t.Fatal("Done not closed after the deadline")
		}
		if cause := context.Cause(ls.Context()); !errors.Is(cause, fence.ErrLeaseLost) {
			t.Fatalf("the lease context's cause = %v, want ErrLeaseLost", cause)
		}
	}

	// Done first, after the deadline.
	ls := acquire(time.Minute)
	pastDeadline(ls)
	closed(ls)
	if err := ls.Err(); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Err after the deadline = %v, want ErrLeaseLost", err)
	}
	if err := ls.Extend(ctx, time.Minute); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Extend after the deadline = %v, want ErrLeaseLost", err)
	}
	_ = ls.Release(ctx)

	// Err first, then Done.
	ls = acquire(time.Minute)
	pastDeadline(ls)
	if err := ls.Err(); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Err after the deadline = %v, want ErrLeaseLost", err)
	}
	closed(ls)
	if err := ls.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release after the deadline = %v, want ErrLeaseLost", err)
	}

	// Done called in time: its timer closes it at the deadline.
	ls = acquire(100 * time.Millisecond)
	select {
	case <-ls.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed 10 s after a 100 ms lease's deadline")
	}
	if err := ls.Err(); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Err after the deadline = %v, want ErrLeaseLost", err)
	}
}
