package pglock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/pglock"
)

// Two Lockers on one database whose tables collide: "locks" keeps its
// tokens in the sequence "locks_token", which is also the name a Locker
// with Table "locks_token" wants for its table (and the reverse order:
// a table "locks_token" where "locks" wants its sequence). PostgreSQL's
// CREATE ... IF NOT EXISTS skips a name taken by a relation of another
// kind, so EnsureSchema must check what it found: it returns an error
// matching fence.ErrInvalidOption, not nil for a schema no Acquire can
// use. The Locker that came first keeps working.
func TestCollidingTables(t *testing.T) {
	for _, order := range [][2]string{{"locks", "locks_token"}, {"locks_token", "locks"}} {
		t.Run(order[0]+"_first", func(t *testing.T) {
			db := pg.NewDB(t)
			first, err := pglock.New(db, &pglock.Options{Table: order[0]})
			if err != nil {
				t.Fatal(err)
			}
			if err := first.EnsureSchema(t.Context()); err != nil {
				t.Fatal(err)
			}
			second, err := pglock.New(db, &pglock.Options{Table: order[1]})
			if err != nil {
				t.Fatal(err)
			}
			err = second.EnsureSchema(t.Context())
			if !errors.Is(err, fence.ErrInvalidOption) {
				_, aerr := second.Acquire(ctxFor(t, 10*time.Second), "x", fence.TTL(time.Minute))
				t.Fatalf("EnsureSchema of table %q after %q = %v, want ErrInvalidOption (its Acquire: %v)", order[1], order[0], err, aerr)
			}
			t.Logf("EnsureSchema: %v", err)
			lease, err := first.Acquire(ctxFor(t, 10*time.Second), "x", fence.TTL(time.Minute))
			if err != nil {
				t.Fatalf("the first Locker no longer works: %v", err)
			}
			_ = lease.Release(ctxFor(t, 10*time.Second))
		})
	}
}

// A table of the application's that has the Locker's Table name, not the
// lease columns: EnsureSchema says so instead of returning nil.
func TestTableNameTakenByApplication(t *testing.T) {
	db := pg.NewDB(t)
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE jobs (id bigint PRIMARY KEY, name text)`); err != nil {
		t.Fatal(err)
	}
	l, err := pglock.New(db, &pglock.Options{Table: "jobs"})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.EnsureSchema(t.Context()); !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("EnsureSchema over an application's table = %v, want ErrInvalidOption", err)
	}
}
