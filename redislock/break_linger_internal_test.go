package redislock

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
)

// TestExpiryRacingRenewalKeepsLease: the expiry timer fires at the deadline
// just as a renewal's successful reply is being applied (renew holds ls.mu:
// it moves the deadline and resets the timer, which re-arms the fired
// timer's function). The timer's function, which then gets ls.mu, must not
// end the lease: Extend returned nil and Deadline is in the future, the
// lock "known to be held" till then. Before, it ended the lease, and with a
// renewal marked ahead (one given up on that ran) it also gave the lock
// back: deleted before the Deadline that Extend had just set.
//
// The renewal's critical section is made here by hand, as renew's success
// path does it, so that the timer fires inside it.
func TestExpiryRacingRenewalKeepsLease(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	fl, err := l.Acquire(ctx, "expiry-racing-renewal", fence.TTL(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ls := fl.(*lease)
	// A renewal that ran in time on Redis (its reply is applied below).
	if err := admin.PExpire(ctx, ls.attempt.keys.lock, 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	done := ls.Done() // makes the expiry timer
	ls.mu.Lock()
	ls.ahead = true // an earlier renewal, given up on, ran
	// Hold ls.mu past the deadline: the timer fires and waits for it.
	select {
	case <-time.After(time.Until(ls.deadline) + 100*time.Millisecond):
	case <-done:
		ls.mu.Unlock()
		t.Fatal("the lease ended while ls.mu was held")
	}
	// The renewal's reply applied now.
	ls.deadline = deadline(time.Now(), 5*time.Second)
	ls.expiry.Reset(time.Until(ls.deadline))
	ls.mu.Unlock()

	gone := time.After(time.Second)
	for {
		if err := ls.Err(); err != nil {
			t.Fatalf("the lease ended with its Deadline %v ahead: %v", time.Until(ls.Deadline()), err)
		}
		if admin.Exists(ctx, ls.attempt.keys.lock).Val() == 0 {
			t.Fatalf("the lock was deleted with the lease's Deadline %v ahead", time.Until(ls.Deadline()))
		}
		select {
		case <-gone:
			if err := ls.Release(ctx); err != nil {
				t.Fatal(err)
			}
			return
		case <-done:
		case <-time.After(5 * time.Millisecond): // polling with a deadline
		}
	}
}
