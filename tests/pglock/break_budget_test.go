package pglock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// A transaction left open on the lock's row (an operator's psql session:
// BEGIN; SELECT ... FOR UPDATE; and lunch) blocks every statement that
// would update the row. An Acquire with a Wait budget and a ctx that
// allows far longer must still return by its budget (ErrNotAcquired), not
// when the ctx ends: its first try is part of the wait (given a second at
// least, so that a budget shorter than a round trip still tries once).
func TestBudgetBoundsFirstTryBlockedOnRowLock(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "rowlock", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	tx, err := d.db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(t.Context(), `SELECT 1 FROM fence_leases WHERE name = 'rowlock' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	const budget = 500 * time.Millisecond
	start := time.Now()
	_, err = l.Acquire(ctxFor(t, 20*time.Second), "rowlock", fence.TTL(time.Minute), fence.Wait(budget))
	took := time.Since(start)
	if !errors.Is(err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire blocked on a row lock = %v, want ErrNotAcquired", err)
	}
	if took > budget+2*time.Second { // the first try's second, and a margin
		t.Fatalf("Acquire with a %v budget returned after %v: its first try was not bounded by the budget", budget, took)
	}
	t.Logf("after %v: %v", took, err)
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	other, err := l.Acquire(ctxFor(t, 10*time.Second), "rowlock", fence.TTL(time.Minute), fence.Wait(3*time.Second))
	if err != nil {
		t.Fatalf("after the given-up Acquire the lock is not free: %v", err)
	}
	_ = other.Release(ctxFor(t, 10*time.Second))
}

// The same row lock, and an Acquire without a Wait budget (try once): its
// one try waits for the row's lock as long as ctx allows, so a caller
// without a deadline hangs until the open transaction ends.
func TestTryOnceBlockedOnRowLock(t *testing.T) {
	t.Skip("design question: a try-once Acquire (Wait 0) waits for a row lock held by a transaction left open on the lock's row as long as its ctx allows. " +
		"Tried: the try's UPDATE restricted by a subquery FOR UPDATE SKIP LOCKED (ErrHeld at once); it passes this test but, under serializable, " +
		"Releases then failed with 40001 (read/write dependencies), and TestCancelledTryGivenBack's row-lock cases, which rely on a blocked try-once, no longer block. " +
		"Choices: SKIP LOCKED with a retry of Release on 40001, or a lock_timeout per try (SET LOCAL in a transaction: two more round trips), or document that Wait 0 waits for row locks")
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "rowlock", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	tx, err := d.db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(t.Context(), `SELECT 1 FROM fence_leases WHERE name = 'rowlock' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = l.Acquire(ctxFor(t, 20*time.Second), "rowlock", fence.TTL(time.Minute))
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("a try-once Acquire returned after %v (%v)", took, err)
	}
	if !errors.Is(err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire = %v, want ErrNotAcquired", err)
	}
}

// A Wait budget shorter than a round trip (here 1 ns) still gets its
// first try, as redislock's does: a free lock is taken, not reported held.
func TestTinyBudgetStillTries(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, open(t, d.dsn, nil)) // a fresh pool: the try dials
	for range 3 {
		lease, err := l.Acquire(ctxFor(t, 10*time.Second), "tiny", fence.TTL(time.Minute), fence.Wait(time.Nanosecond))
		if err != nil {
			t.Fatalf("Acquire of a free lock with a 1 ns budget = %v", err)
		}
		if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}
