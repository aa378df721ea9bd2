package redislock_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redislock"
)

// A late take's give-back that hangs (its release held on the way, as a
// server that stops answering right after the late reply does) held the
// Acquire until the give-back's own bound, the lease time or a second,
// past the wait budget: giveBackLate waited for the caller's ctx only. The
// budget bounds the wait for it; the give-back goes on in the background.

// TestLateTakeGiveBackHungWithinBudget: the Acquire's first try is the late
// one (its reply comes 1.5 s in, of a 2 s budget).
func TestLateTakeGiveBackHungWithinBudget(t *testing.T) {
	const name, ttl, wait = "lock:late-giveback-budget", 1500 * time.Millisecond, 2 * time.Second
	s := newLateTake(t, name)
	s.tr.arm()
	start := time.Now()
	got := acquireAsync(s.l, name, fence.TTL(ttl), fence.Wait(wait))
	s.deliverAfterHoldingGiveBack(t, ttl)
	s.returnsWithinBudget(t, got, start, wait)
}

// TestLateGrantConfirmationGiveBackHungWithinBudget: the late one is a
// waiter's confirmation of its grant, inside the wait loop.
func TestLateGrantConfirmationGiveBackHungWithinBudget(t *testing.T) {
	const name, ttl, wait = "lock:late-grant-giveback-budget", 1500 * time.Millisecond, 2500 * time.Millisecond
	s := newLateTake(t, name)
	holder := acquire(t, lockerWith(t, s.srv.Client(t), redislock.Options{}), name, fence.TTL(time.Minute))
	start := time.Now()
	got := s.queueBehind(t, fence.TTL(ttl), fence.Wait(wait))
	// The grant is confirmed by a try, held on its way past the lease time.
	s.releaseToConfirm(t, holder, ttl/3)
	s.deliverAfterHoldingGiveBack(t, ttl)
	s.returnsWithinBudget(t, got, start, wait)
}

// deliverAfterHoldingGiveBack is deliverAfter, the transit armed, as it
// sends the held try, to hold the give-back that its late reply starts
// (a release script: ReleaseKeys keys, the lock first).
func (s *lateTake) deliverAfterHoldingGiveBack(t *testing.T, ttl time.Duration) {
	t.Helper()
	lock := lockKey(s.name)
	s.tr.mu.Lock()
	s.tr.next = fmt.Appendf(nil, "$1\r\n%d\r\n$%d\r\n%s\r\n", redislock.ReleaseKeys, len(lock), lock)
	s.tr.mu.Unlock()
	s.deliverAfter(t, ttl)
}

// returnsWithinBudget checks that the Acquire started at start with a
// wait budget of wait returned by then (a little later on a loaded
// machine; the give-back's bound is a lease time of 1.5 s), with no lease
// and an error saying the reply came too late.
func (s *lateTake) returnsWithinBudget(t *testing.T, got <-chan acquired, start time.Time, wait time.Duration) {
	t.Helper()
	r := acquired{}.wait(t, got)
	took := time.Since(start)
	if r.lease != nil {
		t.Fatalf("Acquire returned a lease (token %d) after a late take", r.lease.Token())
	}
	if !errors.Is(r.err, fence.ErrNotAcquired) || !strings.Contains(r.err.Error(), "too late") {
		t.Fatalf("Acquire = %v, want ErrNotAcquired saying the reply came too late", r.err)
	}
	if !s.tr.holding() {
		t.Fatal("the give-back was not held: the test did not hang it")
	}
	t.Logf("Acquire after %v of a %v budget, the give-back hung: %v", took.Round(time.Millisecond), wait, r.err)
	if took > wait+600*time.Millisecond {
		t.Errorf("Acquire with a %v budget returned after %v: it waited for the hung give-back past its budget", wait, took.Round(time.Millisecond))
	}
	// The give-back went on without the Acquire: let it through.
	if err := s.tr.deliver(); err != nil {
		t.Fatal(err)
	}
	if err := s.l.WaitGiveBacks(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if n := s.revoked(t); n != 1 {
		t.Errorf("%d revocation marks once the give-back got through, want 1 (the late try's owner)", n)
	}
	if holder := s.admin.Get(ctx(t), lockKey(s.name)).Val(); holder != "" {
		t.Errorf("the late take's lock is still held by %s once its give-back got through", holder)
	}
}
