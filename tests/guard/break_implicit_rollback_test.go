package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence/guard"
)

// TestImplicitRollbackInFn: a statement in Tx's fn fails in a way that, on
// SQLite, ends the whole transaction by itself: the statement's own context
// ends (modernc.org/sqlite interrupts it, and SQLite rolls back a
// transaction whose INSERT, UPDATE or DELETE is interrupted), or a trigger
// refuses the write with RAISE(ROLLBACK) (so do INSERT OR ROLLBACK, ON
// CONFLICT ROLLBACK, and SQLITE_FULL, IOERR and NOMEM). fn does not commit
// or roll back anything itself: it handles the error as handlers do (the
// timed-out statement retried, the refusal recorded) and writes on through
// tx. Meanwhile a newer holder (token 7) fences and writes. fn's write, from
// the older holder (token 5), must not land after the newer holder's: the
// row must end with w7.
//
// PostgreSQL aborts the transaction at the failed statement (releasing its
// locks: the newer holder commits at once) and refuses every later
// statement in it (25P02; pgx closes the connection of a cancelled one):
// fn's next write fails, and the row ends with w7. On SQLite the fence was
// rolled back with everything and the database's write lock released too,
// but fn's next statement ran outside any transaction, committed on its
// own, unfenced: the row ends with w5, and Tx reports only that its COMMIT
// found no transaction.
func TestImplicitRollbackInFn(t *testing.T) {
	failures := map[string]map[string]func(t *testing.T, db *sql.DB) func(tx *sql.Tx) error{
		"postgres": {
			"statement timeout": func(t *testing.T, db *sql.DB) func(tx *sql.Tx) error {
				return func(tx *sql.Tx) error {
					short, cancel := context.WithTimeout(ctx(t), 100*time.Millisecond)
					defer cancel()
					_, err := tx.ExecContext(short, `INSERT INTO accepted (seq, token) SELECT 1, 1 FROM pg_sleep(30)`)
					return err
				}
			},
			"trigger refuses": func(t *testing.T, db *sql.DB) func(tx *sql.Tx) error {
				for _, stmt := range []string{
					`CREATE FUNCTION refuse_fraud() RETURNS trigger LANGUAGE plpgsql AS $$
					BEGIN RAISE EXCEPTION 'refused'; END $$`,
					`CREATE TRIGGER no_fraud BEFORE UPDATE OF status ON payment
					FOR EACH ROW WHEN (NEW.status = 'FRAUD') EXECUTE FUNCTION refuse_fraud()`,
				} {
					if _, err := db.ExecContext(ctx(t), stmt); err != nil {
						t.Fatal(err)
					}
				}
				return refuseFraud(ctx(t))
			},
		},
		"sqlite": {
			"statement timeout": func(t *testing.T, db *sql.DB) func(tx *sql.Tx) error {
				return func(tx *sql.Tx) error {
					short, cancel := context.WithTimeout(ctx(t), 100*time.Millisecond)
					defer cancel()
					_, err := tx.ExecContext(short, `WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000000000)
						INSERT INTO accepted (seq, token) SELECT max(x), 1 FROM c`)
					return err
				}
			},
			"trigger refuses": func(t *testing.T, db *sql.DB) func(tx *sql.Tx) error {
				if _, err := db.ExecContext(ctx(t), `CREATE TRIGGER no_fraud BEFORE UPDATE OF status ON payment
					WHEN NEW.status = 'FRAUD' BEGIN SELECT RAISE(ROLLBACK, 'refused'); END`); err != nil {
					t.Fatal(err)
				}
				return refuseFraud(ctx(t))
			},
		},
	}
	for _, name := range []string{"postgres", "sqlite"} {
		for how, prepare := range failures[name] {
			t.Run(name+"/"+how, func(t *testing.T) {
				db := databases(t)[name]
				db.SetMaxOpenConns(4)
				setup(t, db)
				fail := prepare(t, db)
				c := ctx(t)
				newer := make(chan error, 1)
				var failed, after error
				err := guard.Tx(c, db, "payment:1001", 5, func(tx *sql.Tx) error {
					failed = fail(tx)
					if failed == nil {
						t.Error("the failing statement succeeded")
					}
					go func() {
						newer <- guard.Tx(c, db, "payment:1001", 7, func(tx *sql.Tx) error {
							_, err := tx.ExecContext(c, `UPDATE payment SET approved_by = 'w7' WHERE id = 1001`)
							return err
						})
					}()
					// The newer holder is let in where the older holder's
					// transaction is over (SQLite); where it still holds its
					// fence (PostgreSQL) the newer one waits for it.
					select {
					case err := <-newer:
						newer <- err
					case <-time.After(time.Second):
					}
					// The error handled, fn writes on.
					_, after = tx.ExecContext(c, `UPDATE payment SET approved_by = 'w5' WHERE id = 1001`)
					return nil
				})
				newerErr := <-newer
				_, by, _ := row(t, db)
				last := lastToken(t, db, "payment:1001")
				t.Logf("failed statement: %v; fn's write after it: %v; Tx(5): %v; Tx(7): %v; row approved_by %q, last token %d",
					failed, after, err, newerErr, by.String, last)
				if newerErr != nil {
					t.Fatalf("the newer holder's Tx failed: %v", newerErr)
				}
				if by.String != "w7" {
					t.Fatalf("the row ends with %q, written by token 5's holder after token 7's write (last token %d): an older write landed after a newer one", by.String, last)
				}
				if err == nil {
					t.Error("Tx(5) reported success")
				}
			})
		}
	}
}

// refuseFraud is fn's first statement in TestImplicitRollbackInFn's
// "trigger refuses": an update that the payment table's trigger refuses.
func refuseFraud(c context.Context) func(tx *sql.Tx) error {
	return func(tx *sql.Tx) error {
		_, err := tx.ExecContext(c, `UPDATE payment SET status = 'FRAUD' WHERE id = 1001`)
		return err
	}
}

// The commit hook that Tx sets on SQLite (see TestImplicitRollbackInFn)
// must refuse nothing once Tx has ended (it stays on the connection, set
// once per connection, gateless between Txs): on a pool of one
// connection, after a Tx whose fn failed, one whose fn panicked, one
// refused as stale and one that committed, a plain write through db
// (autocommit, on that same connection) must commit. A hook still gated
// by a Tx that did not reach its commit refuses every later commit on the
// connection.
func TestTxCommitHookRemoved(t *testing.T) {
	db := databases(t)["sqlite"]
	db.SetMaxOpenConns(1)
	setup(t, db)
	c := ctx(t)
	write := func(tx *sql.Tx) error {
		_, err := tx.ExecContext(c, `UPDATE payment SET approved_by = 'tx' WHERE id = 1001`)
		return err
	}
	errFn := errors.New("fn failed")
	ends := []struct {
		name string
		run  func() error
	}{
		{"fn failed", func() error {
			return guard.Tx(c, db, "payment:1001", 5, func(tx *sql.Tx) error { _ = write(tx); return errFn })
		}},
		{"fn panicked", func() (err error) {
			defer func() {
				if recover() == nil {
					err = errors.New("no panic")
				}
			}()
			return guard.Tx(c, db, "payment:1001", 5, func(tx *sql.Tx) error { _ = write(tx); panic("fn") })
		}},
		{"committed", func() error { return guard.Tx(c, db, "payment:1001", 5, write) }},
		{"stale", func() error { return guard.Tx(c, db, "payment:1001", 4, write) }},
	}
	for i, e := range ends {
		err := e.run()
		t.Logf("Tx (%s) = %v", e.name, err)
		if _, err := db.ExecContext(c, `INSERT INTO accepted (seq, token) VALUES ($1, 1)`, i); err != nil {
			t.Fatalf("a plain write after a Tx (%s) on the same connection = %v", e.name, err)
		}
	}
	var n int
	if err := db.QueryRowContext(c, `SELECT count(*) FROM accepted`).Scan(&n); err != nil || n != len(ends) {
		t.Fatalf("%d plain writes committed (%v), want %d", n, err, len(ends))
	}
}
