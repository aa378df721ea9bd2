package guard_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"path/filepath"
	"testing"

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
