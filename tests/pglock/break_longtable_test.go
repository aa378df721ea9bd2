package pglock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/pglock"
)

// The longest table name (its sequence's name is then PostgreSQL's 63-byte
// limit, and so is nearly its NOTIFY channel) with the longest lock name
// as the notification's payload: EnsureSchema, a grant and a waiter woken
// by the release all work, nothing truncated into another name.
func TestLongestTableAndName(t *testing.T) {
	d := newDatabase(t, pg)
	table := strings.Repeat("t", pglock.MaxTableLen)
	l := d.lockerWith(t, d.db, pglock.Options{Table: table})
	if err := l.EnsureSchema(t.Context()); err != nil {
		t.Fatal(err)
	}
	name := strings.Repeat("n", fence.MaxNameLen)
	holder, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		lease, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute), fence.Wait(8*time.Second))
		if err == nil {
			_ = lease.Release(context.Background())
		}
		got <- err
	}()
	waitUntil(t, func() bool {
		var n int
		err := d.db.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&n)
		return err == nil && n > 0
	})
	start := time.Now()
	if err := holder.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("the waiter took the lock %v after the release: no notification", took)
	}
	var seq string
	if err := d.db.QueryRowContext(t.Context(), `SELECT relname FROM pg_class WHERE relkind = 'S' AND relname LIKE 'ttt%'`).Scan(&seq); err != nil || seq != table+"_token" {
		t.Fatalf("sequence %q (%v), want %q", seq, err, table+"_token")
	}
}
