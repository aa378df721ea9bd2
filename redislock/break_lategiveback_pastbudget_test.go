package redislock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// TestLateTakePastBudgetGivenBackBeforeReturn: an Acquire's first try runs
// on ctx alone, so with a wait budget no longer than the lease time (the
// usual case) a reply late for the lease is past the budget too. The
// server answers again; the give-back's round trip takes 50 ms (the
// network that made the reply late is still slow). 44610fb made
// giveBackLate stop waiting at the budget's end, which here has passed
// before the give-back is even sent: Acquire returned at once with the
// lock still held by the late try's owner (nobody). A program that exits
// on that error (a careless user's, without WaitGiveBacks, which the docs
// ask for only after a cancelled Acquire) leaves it held for the lease
// time; a caller that tries again at once without a budget gets ErrHeld.
// Before 44610fb the Acquire waited for the give-back (until ctx ended),
// and the lock was free when it returned.
func TestLateTakePastBudgetGivenBackBeforeReturn(t *testing.T) {
	const name, ttl, wait = "lock:late-past-budget", 300 * time.Millisecond, 100 * time.Millisecond
	const rtt = 50 * time.Millisecond
	s := newLateTake(t, name)
	s.tr.arm()
	start := time.Now()
	got := acquireAsync(s.l, name, fence.TTL(ttl), fence.Wait(wait))
	s.deliverAfterHoldingGiveBack(t, ttl) // the late reply; its give-back held
	waitFor(t, s.tr.holding)
	select {
	case r := <-got:
		holder := s.admin.Get(ctx(t), lockKey(name)).Val()
		_ = s.tr.deliver()
		_ = s.l.WaitGiveBacks(ctx(t))
		t.Fatalf("Acquire (%v budget) returned after %v, its give-back not yet through (%v in transit): %v; the lock held by %q", wait,
			time.Since(start).Round(time.Millisecond), rtt, r.err, holder)
	case <-time.After(rtt):
	}
	if err := s.tr.deliver(); err != nil {
		t.Fatal(err)
	}
	r := acquired{}.wait(t, got)
	// Looked at before anything else: the Acquire has returned.
	holder, pttl := s.admin.Get(ctx(t), lockKey(name)).Val(), s.admin.PTTL(ctx(t), lockKey(name)).Val()
	if err := s.l.WaitGiveBacks(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if r.lease != nil {
		t.Fatalf("Acquire returned a lease (token %d) after a late take", r.lease.Token())
	}
	if !errors.Is(r.err, fence.ErrNotAcquired) || !strings.Contains(r.err.Error(), "too late") {
		t.Fatalf("Acquire = %v, want ErrNotAcquired saying the reply came too late", r.err)
	}
	t.Logf("Acquire after %v: %v", time.Since(start).Round(time.Millisecond), r.err)
	if holder != "" {
		t.Errorf("Acquire returned with the lock still held by %s for %v", holder, pttl)
	}
	if n := s.revoked(t); n != 1 {
		t.Errorf("%d revocation marks, want 1 (the late try's owner)", n)
	}
}
