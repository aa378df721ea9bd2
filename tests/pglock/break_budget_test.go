package pglock_test

import (
	"context"
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
// one try waits for the row's lock as long as ctx allows, then fails with
// ctx's error, and the lock is free once the transaction ends (documented
// in pglock's doc, "Waiting"; decided over FOR UPDATE SKIP LOCKED, which
// answered at once but made Releases fail with 40001 under SERIALIZABLE,
// and over a lock_timeout per try, two more round trips for every try).
func TestTryOnceBlockedOnRowLock(t *testing.T) {
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
	const limit = 1500 * time.Millisecond
	start := time.Now()
	_, err = l.Acquire(ctxFor(t, limit), "rowlock", fence.TTL(time.Minute))
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a try-once Acquire blocked on a row lock = %v after %v, want ctx's DeadlineExceeded", err, took)
	}
	if took < limit || took > limit+5*time.Second {
		t.Fatalf("a try-once Acquire blocked on a row lock returned after %v, want at its ctx's deadline (%v)", took, limit)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	next, err := l.Acquire(ctxFor(t, 10*time.Second), "rowlock", fence.TTL(time.Minute), fence.Wait(5*time.Second))
	if err != nil {
		t.Fatalf("after the open transaction ended the lock is not free: %v", err)
	}
	_ = next.Release(ctxFor(t, 10*time.Second))
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
