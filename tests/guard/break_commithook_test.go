package guard_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"modernc.org/sqlite"
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
	last := lastToken(t, db, "payment:1001")
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

// retainingConn is a SQLite connection whose RegisterCommitHook and
// RegisterRollbackHook keep every callback given until the connection
// closes, as mattn/go-sqlite3's do (each call takes a new handle, freed
// only by Close), with mattn's signatures (a commit hook returning int).
// The hooks are set on the modernc.org/sqlite connection underneath.
type retainingConn struct {
	driver.Conn
	kept *atomic.Int64 // callbacks held, over the pool's connections
	mine int64
}

func (c *retainingConn) RegisterCommitHook(f func() int) {
	h := c.Conn.(interface{ RegisterCommitHook(sqlite.CommitHookFn) })
	if f == nil {
		h.RegisterCommitHook(nil)
		return
	}
	c.mine++
	c.kept.Add(1)
	h.RegisterCommitHook(func() int32 { return int32(f()) })
}

func (c *retainingConn) RegisterRollbackHook(f func()) {
	h := c.Conn.(interface{ RegisterRollbackHook(sqlite.RollbackHookFn) })
	if f == nil {
		h.RegisterRollbackHook(nil)
		return
	}
	c.mine++
	c.kept.Add(1)
	h.RegisterRollbackHook(sqlite.RollbackHookFn(f))
}

func (c *retainingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c *retainingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *retainingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (c *retainingConn) Close() error {
	c.kept.Add(-c.mine)
	c.mine = 0
	return c.Conn.Close()
}

type retainingConnector struct {
	dsn  string
	d    driver.Driver
	kept *atomic.Int64
}

func (c retainingConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.d.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &retainingConn{Conn: conn, kept: c.kept}, nil
}

func (c retainingConnector) Driver() driver.Driver { return c.d }

// TestTxHooksNotHeldPerTx: on a driver whose hook registrations are held
// until the connection closes (mattn/go-sqlite3: measured outside this
// module, 40,000 Txs on one connection grew the heap by 12.7 MB, about
// 300 bytes a Tx), Tx must not register hooks anew for every transaction,
// or a pooled connection, which lives as long as the process, grows
// without bound. And the hooks must still protect the Txs after the first
// on that connection: fn's write after a RAISE(ROLLBACK) is refused.
func TestTxHooksNotHeldPerTx(t *testing.T) {
	lite := databases(t)["sqlite"]
	kept := new(atomic.Int64)
	db := sql.OpenDB(retainingConnector{dsn: guard.SQLiteDSN(filepath.Join(t.TempDir(), "retaining.db")), d: lite.Driver(), kept: kept})
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	setup(t, db)
	c := ctx(t)
	const txs = 50
	for i := 1; i <= txs; i++ {
		if err := guard.Tx(c, db, "payment:1001", fence.Token(i), func(tx *sql.Tx) error {
			_, err := tx.ExecContext(c, `UPDATE payment SET approved_by = 'tx' WHERE id = 1001`)
			return err
		}); err != nil {
			t.Fatalf("Tx %d: %v", i, err)
		}
	}
	t.Logf("after %d Txs on one connection the driver holds %d hook callbacks", txs, kept.Load())
	if n := kept.Load(); n > 2 {
		t.Errorf("after %d Txs on one connection the driver holds %d hook callbacks, want at most 2 (one commit hook, one rollback hook)", txs, n)
	}
	if _, err := db.ExecContext(c, `CREATE TRIGGER no_fraud BEFORE UPDATE OF status ON payment
		WHEN NEW.status = 'FRAUD' BEGIN SELECT RAISE(ROLLBACK, 'refused'); END`); err != nil {
		t.Fatal(err)
	}
	var after error
	err := guard.Tx(c, db, "payment:1001", txs+1, func(tx *sql.Tx) error {
		_ = refuseFraud(c)(tx)
		_, after = tx.ExecContext(c, `UPDATE payment SET approved_by = 'stray' WHERE id = 1001`)
		return nil
	})
	_, by, _ := row(t, db)
	if by.String == "stray" || after == nil || err == nil {
		t.Fatalf("fn's write after the fenced transaction ended: %v, Tx: %v, approved_by %q: the hooks did not protect this Tx", after, err, by.String)
	}
}

// TestTxOwnSQLCommitOnSQLite: what Tx's doc says of fn ending tx with SQL
// of its own on SQLite: the hooks refuse fn's statements after a COMMIT
// or ROLLBACK (nothing written, no token recorded), and Tx fails; also
// after tx.Rollback.
func TestTxOwnSQLCommitOnSQLite(t *testing.T) {
	ends := map[string]func(tx *sql.Tx) error{
		"COMMIT":      func(tx *sql.Tx) error { _, err := tx.ExecContext(context.Background(), `COMMIT`); return err },
		"ROLLBACK":    func(tx *sql.Tx) error { _, err := tx.ExecContext(context.Background(), `ROLLBACK`); return err },
		"tx.Rollback": func(tx *sql.Tx) error { return tx.Rollback() },
	}
	for name, end := range ends {
		t.Run(name, func(t *testing.T) {
			db := databases(t)["sqlite"]
			setup(t, db)
			c := ctx(t)
			var ended, after error
			err := guard.Tx(c, db, "payment:1001", 5, func(tx *sql.Tx) error {
				ended = end(tx)
				_, after = tx.ExecContext(c, `UPDATE payment SET approved_by = 'w5' WHERE id = 1001`)
				return nil
			})
			_, by, _ := row(t, db)
			var n int
			if qerr := db.QueryRowContext(c, `SELECT count(*) FROM fence_tokens`).Scan(&n); qerr != nil {
				t.Fatal(qerr)
			}
			t.Logf("%s: %v; write after it: %v; Tx: %v; approved_by %q, %d token(s)", name, ended, after, err, by.String, n)
			if err == nil || by.String == "w5" || n != 0 {
				t.Fatalf("fn's %s then a write: Tx %v, approved_by %q, %d token(s) recorded; want Tx failed, nothing written", name, err, by.String, n)
			}
		})
	}
}

// TestTxSavepointsAndStatementErrorsCommit: what SQLite rolls back short
// of the whole transaction must not count as its end for Tx's rollback
// hook: fn's ROLLBACK TO a savepoint, and a statement refused by a
// constraint (SQLite undoes that statement only), handled in fn, which
// then writes on. Tx commits, with the fence and fn's other writes.
func TestTxSavepointsAndStatementErrorsCommit(t *testing.T) {
	db := databases(t)["sqlite"]
	setup(t, db)
	c := ctx(t)
	err := guard.Tx(c, db, "payment:1001", 5, func(tx *sql.Tx) error {
		for _, stmt := range []string{
			`SAVEPOINT a`,
			`UPDATE payment SET approved_by = 'undone' WHERE id = 1001`,
			`ROLLBACK TO a`,
			`RELEASE a`,
			`INSERT INTO accepted (seq, token) VALUES (1, 5)`,
		} {
			if _, err := tx.ExecContext(c, stmt); err != nil {
				return fmt.Errorf("%s: %w", stmt, err)
			}
		}
		if _, err := tx.ExecContext(c, `INSERT INTO accepted (seq, token) VALUES (1, 5)`); err == nil {
			return errors.New("a duplicate key was accepted")
		}
		_, err := tx.ExecContext(c, `UPDATE payment SET approved_by = 'w5' WHERE id = 1001`)
		return err
	})
	_, by, _ := row(t, db)
	var n, last int
	if qerr := db.QueryRowContext(c, `SELECT (SELECT count(*) FROM accepted), (SELECT token FROM fence_tokens)`).Scan(&n, &last); qerr != nil {
		t.Fatal(qerr)
	}
	if err != nil || by.String != "w5" || n != 1 || last != 5 {
		t.Fatalf("Tx: %v; approved_by %q, %d accepted row(s), last token %d; want nil, w5, 1, 5", err, by.String, n, last)
	}
}

// TestTxDeadlineInFnOnSQLite: Tx's ctx ends while fn runs, and fn returns
// nil (it had nothing left to send). database/sql rolls the transaction
// back when ctx ends; Tx must say why, with ctx's error (Tx's doc: a
// cancelled ctx rolls back; callers tell a deadline by errors.Is, as the
// PostgreSQL hang tests do), not only that the transaction ended. fn
// waits, before returning, for the database's write lock to be free again
// (BEGIN IMMEDIATE on another connection), so that the rollback is done.
func TestTxDeadlineInFnOnSQLite(t *testing.T) {
	db := databases(t)["sqlite"]
	setup(t, db)
	short, cancel := context.WithTimeout(ctx(t), 100*time.Millisecond)
	defer cancel()
	err := guard.Tx(short, db, "payment:1001", 5, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(short, `UPDATE payment SET approved_by = 'w5' WHERE id = 1001`); err != nil {
			return err
		}
		<-short.Done()
		other, err := db.BeginTx(ctx(t), nil) // waits (busy timeout) for the rollback
		if err != nil {
			t.Errorf("another transaction after the rollback: %v", err)
			return nil
		}
		_ = other.Rollback()
		return nil
	})
	_, by, _ := row(t, db)
	t.Logf("Tx: %v; approved_by %q", err, by.String)
	if !errors.Is(err, context.DeadlineExceeded) || by.String == "w5" {
		t.Fatalf("Tx whose ctx ended in fn: %v (approved_by %q), want context.DeadlineExceeded, nothing written", err, by.String)
	}
}
