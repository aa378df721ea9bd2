package pglock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/pglock"
)

// Names that differ only by case, by Unicode normalisation (é composed
// and decomposed), by a trailing space, or by width are different locks, as in
// redislock: the table compares bytes (deterministic collation), so no two
// of them collide, and all can be held at once.
func TestNamesThatLookAlikeAreDistinct(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	names := []string{"café", "cafe\u0301", "Café", "CAFÉ", "café ", "ｃａｆé"}
	var held []fence.Lease
	defer func() {
		for _, h := range held {
			_ = h.Release(context.Background())
		}
	}()
	for _, name := range names {
		lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
		if err != nil {
			t.Fatalf("Acquire(%q) with %d look-alikes held: %v", name, len(held), err)
		}
		held = append(held, lease)
	}
}

// Two Lockers on one database, each with its own schema through the
// connection's search_path and the same table name: their locks are
// independent (each can hold "x"), and each one's tokens grow.
func TestLockersInTwoSchemas(t *testing.T) {
	d := newDatabase(t, pg)
	var lockers []*pglock.Locker
	for _, schema := range []string{"tenant_a", "tenant_b"} {
		if _, err := d.db.ExecContext(t.Context(), `CREATE SCHEMA `+schema); err != nil {
			t.Fatal(err)
		}
		l := d.locker(t, open(t, d.dsn+"&search_path="+schema, nil))
		if err := l.EnsureSchema(t.Context()); err != nil {
			t.Fatal(err)
		}
		lockers = append(lockers, l)
	}
	var leases []fence.Lease
	for _, l := range lockers {
		lease, err := l.Acquire(ctxFor(t, 10*time.Second), "x", fence.TTL(time.Minute))
		if err != nil {
			t.Fatalf("the other schema's lock is held, and so is this one: %v", err)
		}
		leases = append(leases, lease)
	}
	for _, lease := range leases {
		if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	for _, schema := range []string{"tenant_a", "tenant_b"} {
		if err := d.db.QueryRowContext(t.Context(), `SELECT count(*) FROM `+schema+`.fence_leases`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%s.fence_leases has %d rows (%v), want 1", schema, n, err)
		}
	}
}
