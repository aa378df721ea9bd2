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
