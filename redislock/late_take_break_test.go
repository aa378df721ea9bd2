package redislock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// TestLateTakeRetryWithinBudget: an Acquire with a 2 s wait budget whose
// first try takes the lock with a reply past the lease's deadline gives it
// back and tries again with a new owner; that try is held on its way (the
// server hangs now). The budget bounds every try but the Acquire's first
// (README), but the try again was made as a first try, on the caller's
// context alone: Acquire returned only when the client's read timeout
// (10 s) ended it. Then the held try reaches Redis: its owner, given up
// on, must not take the lock.
func TestLateTakeRetryWithinBudget(t *testing.T) {
	const name, ttl, wait = "lock:late-take-retry-budget", 300 * time.Millisecond, 2 * time.Second
	s := newLateTake(t, name)
	s.tr.arm()
	start := time.Now()
	got := acquireAsync(s.l, name, fence.TTL(ttl), fence.Wait(wait))
	waitFor(t, s.tr.holding)
	probe, err := s.l.Acquire(ctx(t), name+":probe", fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	<-probe.Done()
	s.tr.arm() // the try again, once the first is delivered
	if err := s.tr.deliver(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s.tr.holding)
	r := acquired{}.wait(t, got)
	took := time.Since(start)
	if r.lease != nil {
		t.Fatalf("Acquire returned a lease (token %d) though its try again is held", r.lease.Token())
	}
	if !errors.Is(r.err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire = %v, want ErrNotAcquired", r.err)
	}
	t.Logf("Acquire after %v: %v", took.Round(time.Millisecond), r.err)
	if took > wait+time.Second {
		t.Errorf("Acquire with a %v budget returned after %v: its try again after the late take was not bounded by the budget", wait, took.Round(time.Millisecond))
	}
	// The try held on its way arrives now, for an owner whose Acquire
	// gave up: it must not take the lock.
	if err := s.l.WaitGiveBacks(ctx(t)); err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, s.admin, "evalsha")
	if err := s.tr.deliver(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return commandCalls(t, s.admin, "evalsha") > before })
	if holder, pttl := s.admin.Get(ctx(t), lockKey(name)).Val(), s.admin.PTTL(ctx(t), lockKey(name)).Val(); holder != "" {
		t.Errorf("after the held try arrived late, the lock is held by %s for %v", holder, pttl)
	}
}
