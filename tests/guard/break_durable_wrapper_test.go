package guard_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
	"testing"

	"github.com/fencekit/fence/guard"
)

// flatConnector opens the same driver's connections wrapped as some
// logging wrappers do: a failed statement's error is the statement and
// the driver's message, flattened into a string, so that the driver's
// error type (pgx's *pgconn.PgError and its SQLState) is gone.
type flatConnector struct {
	dsn string
	d   driver.Driver
}

func (c flatConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.d.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return flatConn{conn}, nil
}

func (c flatConnector) Driver() driver.Driver { return c.d }

type flatConn struct{ driver.Conn }

func (c flatConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	res, err := c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
	if err != nil {
		return nil, fmt.Errorf("exec %s: %v", query, err)
	}
	return res, nil
}

func (c flatConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
	if err != nil {
		return nil, fmt.Errorf("query %s: %v", query, err)
	}
	return rows, nil
}

func (c flatConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

// TestDurableFormNotDroppedOnPostgreSQL: the token-recording statements
// fall back to their plain form only where set_config is unknown
// (SQLite). On PostgreSQL through a wrapper that flattens errors (no
// SQLSTATE left, the statement's text, which names set_config, in the
// message), a refusal of the durable form for another reason (here a
// role that may not execute set_config: permission denied, 42501) was
// taken for SQLite's, and the plain statement ran: Fence, Table.Update
// and Once returned nil, their commit not made durable (under
// synchronous_commit = off a crash could lose it, as in
// TestFenceSurvivesCrashUnderAsyncCommit), where through pgx itself they
// fail. Before the fix all three returned nil.
func TestDurableFormNotDroppedOnPostgreSQL(t *testing.T) {
	name, err := pg.CreateDatabase(ctx(t), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	admin := openPG(t, pg.DSN(name))
	setup(t, admin)
	role := "app_" + name // roles are the server's, databases' names unique
	for _, stmt := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT ALL ON ALL TABLES IN SCHEMA public TO ` + role,
		`REVOKE EXECUTE ON FUNCTION pg_catalog.set_config(text, text, boolean) FROM PUBLIC`,
	} {
		if _, err := admin.ExecContext(ctx(t), stmt); err != nil {
			t.Fatal(err)
		}
	}
	db := sql.OpenDB(flatConnector{dsn: strings.Replace(pg.DSN(name), "postgres@", role+"@", 1), d: admin.Driver()})
	t.Cleanup(func() { _ = db.Close() })
	for _, c := range []struct {
		what string
		err  error
	}{
		{"Fence", guard.Fence(ctx(t), db, "payment:1001", 5)},
		{"Table.Update", payments.Update(ctx(t), db, 1001, 5, "approved_by = $3", "w5")},
		{"Once", guard.Once(ctx(t), db, "approve:1001")},
	} {
		what, err := c.what, c.err
		if err == nil {
			t.Errorf("%s on PostgreSQL, with set_config refused, recorded its token or key with the plain statement: nil, want the refusal", what)
		} else if !strings.Contains(err.Error(), "permission denied for function set_config") {
			t.Errorf("%s: %v, want the refusal of set_config", what, err)
		}
	}
}
