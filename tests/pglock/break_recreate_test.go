package pglock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/pglock"
)

// A careless operator empties the lease table, restarts the token
// sequence, or drops both and lets EnsureSchema create them again (a
// migration rerun, a schema restored without its sequence): the token
// counter is lost, as a Redis counter is after a restart without
// persistence. The tokens of a name must still only grow, or the resource
// would accept a new holder's writes as older than the last one's (or
// refuse them for good).
func TestTokensGrowAfterTableOrSequenceReset(t *testing.T) {
	for _, c := range []struct{ name, reset string }{
		{"truncate", `TRUNCATE fence_leases`},
		{"restart sequence", `ALTER SEQUENCE fence_leases_token RESTART`},
		{"recreate schema", `DROP TABLE fence_leases; DROP SEQUENCE fence_leases_token`},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newDatabase(t, pg)
			l := d.locker(t, d.db)
			var last fence.Token
			for range 3 {
				lease, err := l.Acquire(ctxFor(t, 10*time.Second), "reset", fence.TTL(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				last = lease.Token()
				if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := d.db.ExecContext(t.Context(), c.reset); err != nil {
				t.Fatal(err)
			}
			if err := l.EnsureSchema(t.Context()); err != nil {
				t.Fatal(err)
			}
			lease, err := l.Acquire(ctxFor(t, 10*time.Second), "reset", fence.TTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctxFor(t, 10*time.Second))
			if lease.Token() <= last {
				t.Fatalf("after %s: token %d, want > %d, the last one issued before", c.reset, lease.Token(), last)
			}
		})
	}
}

// A name whose last token is the bigint maximum (set by hand, or the
// sequence restarted after its end) can have no greater token: Acquire
// fails with ErrTokensExhausted rather than issue a smaller one.
func TestNameAtMaxTokenIsExhausted(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	lease, err := l.Acquire(ctxFor(t, 10*time.Second), "max", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.db.ExecContext(t.Context(), `UPDATE fence_leases SET token = 9223372036854775807 WHERE name = 'max'`); err != nil {
		t.Fatal(err)
	}
	lease, err = l.Acquire(ctxFor(t, 10*time.Second), "max", fence.TTL(time.Minute), fence.Wait(5*time.Second))
	if err == nil {
		_ = lease.Release(ctxFor(t, 10*time.Second))
		t.Fatalf("Acquire after the maximum token got token %d", lease.Token())
	}
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, pglock.ErrTokensExhausted) {
		t.Fatalf("Acquire after the maximum token = %v, want ErrNotAcquired and pglock.ErrTokensExhausted", err)
	}
}

// An operator gives the token sequence a cache (ALTER SEQUENCE ... CACHE,
// a common tuning): each session then takes its own block of values, and
// nextval no longer increases across sessions in time order. Two pools
// taking turns on one name still get increasing tokens.
func TestTokensGrowWithSequenceCache(t *testing.T) {
	d := newDatabase(t, pg)
	if _, err := d.db.ExecContext(t.Context(), `ALTER SEQUENCE fence_leases_token CACHE 100`); err != nil {
		t.Fatal(err)
	}
	var lockers []*pglock.Locker
	for range 2 {
		db := open(t, d.dsn, nil)
		db.SetMaxOpenConns(1) // one session each, one cached block each
		lockers = append(lockers, d.locker(t, db))
	}
	var last fence.Token
	for i := range 6 {
		lease, err := lockers[i%2].Acquire(ctxFor(t, 10*time.Second), "cached", fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if lease.Token() <= last {
			t.Fatalf("grant %d: token %d after %d", i, lease.Token(), last)
		}
		last = lease.Token()
		if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}
