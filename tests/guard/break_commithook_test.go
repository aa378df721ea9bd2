package guard_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencekit/fence/guard"
)

// hiddenConnector opens the same driver's connections wrapped so that
// they do not show RegisterCommitHook (as a tracing or logging wrapper
// does), while its Driver() is the wrapped driver itself.
type hiddenConnector struct {
	dsn string
	d   driver.Driver
}

func (c hiddenConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.d.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return hiddenConn{conn}, nil
}

func (c hiddenConnector) Driver() driver.Driver { return c.d }

type hiddenConn struct{ driver.Conn }

// TestCommitHookNotLostToWrappedPool: an application with two pools of
// the same SQLite driver, one opened through a connector that wraps its
// connections (no commit hook can be set there), the other plain. A Tx on
// the wrapped pool must not take the hook away from Txs on the plain one:
// there, after a trigger's RAISE(ROLLBACK) has ended the fenced
// transaction, fn's next write through tx must still be refused, not
// committed on its own, unfenced.
func TestCommitHookNotLostToWrappedPool(t *testing.T) {
	plain, err := sql.Open("sqlite", guard.SQLiteDSN(filepath.Join(t.TempDir(), "plain.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })
	wrapped := sql.OpenDB(hiddenConnector{dsn: guard.SQLiteDSN(filepath.Join(t.TempDir(), "wrapped.db")), d: plain.Driver()})
	t.Cleanup(func() { _ = wrapped.Close() })
	c := ctx(t)
	setup(t, wrapped)
	if err := guard.Tx(c, wrapped, "payment:1001", 1, func(tx *sql.Tx) error { return nil }); err != nil {
		t.Fatalf("Tx on the wrapped pool: %v", err)
	}

	setup(t, plain)
	if _, err := plain.ExecContext(c, `CREATE TRIGGER no_fraud BEFORE UPDATE OF status ON payment
		WHEN NEW.status = 'FRAUD' BEGIN SELECT RAISE(ROLLBACK, 'refused'); END`); err != nil {
		t.Fatal(err)
	}
	var failed, after error
	err = guard.Tx(c, plain, "payment:1001", 5, func(tx *sql.Tx) error {
		failed = refuseFraud(c)(tx)
		_, after = tx.ExecContext(c, `UPDATE payment SET approved_by = 'w5' WHERE id = 1001`)
		return nil
	})
	_, by, _ := row(t, plain)
	var n int
	if qerr := plain.QueryRowContext(c, `SELECT count(*) FROM fence_tokens`).Scan(&n); qerr != nil {
		t.Fatal(qerr)
	}
	t.Logf("failed statement: %v; fn's write after it: %v; Tx: %v; approved_by %q; %d token(s) recorded", failed, after, err, by.String, n)
	if failed == nil {
		t.Fatal("the trigger did not refuse")
	}
	if by.String == "w5" {
		t.Fatalf("fn's write after the transaction ended committed unfenced (approved_by %q, %d token(s) recorded): the commit hook was not set on the plain pool after a Tx on the wrapped one", by.String, n)
	}
	if err == nil {
		t.Error("Tx reported success")
	}
}

// TestSavepointAfterImplicitRollback: fn uses savepoints for partial
// rollbacks, an idiom common on PostgreSQL (SAVEPOINT before a statement
// that may fail, ROLLBACK TO it on failure, nothing released). A trigger's
// RAISE(ROLLBACK) ends the whole fenced transaction on SQLite, so the
// ROLLBACK TO finds no savepoint and fn's next SAVEPOINT, in autocommit
// mode, opens a new transaction of its own: fn's write in it is not
// fenced, and Tx's own commit must not commit it. Meanwhile a newer holder
// (token 7) fences and writes: the row must end with w7, and Tx(5) must
// not report success.
func TestSavepointAfterImplicitRollback(t *testing.T) {
	db := databases(t)["sqlite"]
	db.SetMaxOpenConns(4)
	setup(t, db)
	c := ctx(t)
	if _, err := db.ExecContext(c, `CREATE TRIGGER no_fraud BEFORE UPDATE OF status ON payment
		WHEN NEW.status = 'FRAUD' BEGIN SELECT RAISE(ROLLBACK, 'refused'); END`); err != nil {
		t.Fatal(err)
	}
	newer := make(chan error, 1)
	var failed, undo, after error
	err := guard.Tx(c, db, "payment:1001", 5, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(c, `SAVEPOINT flag`); err != nil {
			return err
		}
		if _, failed = tx.ExecContext(c, `UPDATE payment SET status = 'FRAUD' WHERE id = 1001`); failed != nil {
			_, undo = tx.ExecContext(c, `ROLLBACK TO flag`)
		}
		go func() {
			newer <- guard.Tx(c, db, "payment:1001", 7, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(c, `UPDATE payment SET approved_by = 'w7' WHERE id = 1001`)
				return err
			})
		}()
		select {
		case err := <-newer:
			newer <- err
		case <-time.After(5 * time.Second):
			t.Error("the newer holder did not finish while the older's transaction was over")
		}
		if _, err := tx.ExecContext(c, `SAVEPOINT approve`); err != nil {
			return err
		}
		_, after = tx.ExecContext(c, `UPDATE payment SET approved_by = 'w5' WHERE id = 1001`)
		return after
	})
	newerErr := <-newer
	_, by, _ := row(t, db)
	var last int64
	if qerr := db.QueryRowContext(c, `SELECT token FROM fence_tokens WHERE resource = 'payment:1001'`).Scan(&last); qerr != nil {
		t.Fatal(qerr)
	}
	t.Logf("failed statement: %v; ROLLBACK TO: %v; fn's write after it: %v; Tx(5): %v; Tx(7): %v; approved_by %q, last token %d",
		failed, undo, after, err, newerErr, by.String, last)
	if failed == nil {
		t.Fatal("the trigger did not refuse")
	}
	if newerErr != nil {
		t.Fatalf("the newer holder's Tx failed: %v", newerErr)
	}
	if by.String != "w7" {
		t.Fatalf("the row ends with %q, written by token 5's holder after token 7's write (last token %d)", by.String, last)
	}
	if err == nil {
		t.Error("Tx(5) reported success")
	}
}
