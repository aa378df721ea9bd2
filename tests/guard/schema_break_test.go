package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence/guard"
)

// guard.CreateIfNotExists attacked: schema upgrades, several services,
// wrapped transactions, errors that are no race, SQLite.

// atOnce runs f(i, start) in n goroutines and returns their errors in
// order: each does what it must before the others (opens its own
// connection, say), waits for start to close, and goes.
func atOnce(n int, f func(i int, start <-chan struct{}) error) []error {
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(i, start) })
	}
	close(start)
	wg.Wait()
	return errs
}

// sqlState returns err's SQLSTATE, or "" if it has none.
func sqlState(err error) string {
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		return pg.SQLState()
	}
	return ""
}

// holdCreate runs stmts with CreateIfNotExists in a transaction of its own
// and leaves it open: another worker's run paused between its CREATEs and
// its commit. It returns the transaction and its backend's pid.
func holdCreate(t *testing.T, db *sql.DB, stmts ...string) (*sql.Tx, int) {
	t.Helper()
	tx, err := db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	if err := guard.CreateIfNotExists(ctx(t), tx, stmts...); err != nil {
		t.Fatalf("%s: %v", stmts, err)
	}
	var pid int
	if err := tx.QueryRowContext(ctx(t), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return tx, pid
}

// waitBlockedBy waits until a session of db's database whose statement
// starts with prefix waits for a lock that holder (a backend pid) holds,
// or fails the test after 10 s.
func waitBlockedBy(t *testing.T, db *sql.DB, holder int, prefix string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'active'
			AND starts_with(ltrim(query), $1) AND $2 = ANY (pg_blocking_pids(pid))`, prefix, holder).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session running %q waits for backend %d after 10 s", prefix, holder)
		}
		<-tick.C
	}
}

// TestCreateIfNotExistsSchemaUpgradeAtOnce: a service's schema gains an
// index on an existing table and a new table referencing it (version 2 of
// the schema), and its workers, restarted at once on the new version, all
// run it. CREATE INDEX takes a SHARE lock on account; the FOREIGN KEY of
// the new table needs SHARE ROW EXCLUSIVE on it; two runs of the same
// string deadlock (40P01) unless CreateIfNotExists runs them one at a time.
func TestCreateIfNotExistsSchemaUpgradeAtOnce(t *testing.T) {
	const v1 = `CREATE TABLE IF NOT EXISTS account (id BIGINT PRIMARY KEY, owner TEXT NOT NULL)`
	const v2 = v1 + `;
CREATE INDEX IF NOT EXISTS account_by_owner ON account (owner);
CREATE TABLE IF NOT EXISTS transfer (
	id      BIGINT PRIMARY KEY,
	account BIGINT NOT NULL REFERENCES account (id),
	amount  BIGINT NOT NULL
)`
	const workers = 8
	failed := 0
	for round := range 5 {
		db := pg.NewDB(t)
		db.SetMaxOpenConns(workers)
		if err := guard.CreateIfNotExists(ctx(t), db, v1); err != nil {
			t.Fatal(err)
		}
		// The table has rows (it is an upgrade): the index takes a moment.
		if _, err := db.ExecContext(ctx(t), `INSERT INTO account SELECT g, 'o' || (g % 1000) FROM generate_series(1, 200000) g`); err != nil {
			t.Fatal(err)
		}
		for _, err := range atOnce(workers, func(_ int, start <-chan struct{}) error {
			<-start
			return guard.CreateIfNotExists(ctx(t), db, v2)
		}) {
			if err != nil {
				failed++
				t.Errorf("round %d: CreateIfNotExists of schema v2 with %d workers at once: %v (SQLSTATE %s)", round, workers-1, err, sqlState(err))
			}
		}
	}
	if failed > 0 {
		t.Logf("%d of %d calls failed", failed, 5*workers)
	}
}

// TestCreateIfNotExistsSchemaUpgradeDeadlock: the same deadlock as
// TestCreateIfNotExistsSchemaUpgradeAtOnce, made certain: the other
// worker's run of schema v2 is held (an open transaction) after its CREATE
// INDEX, until CreateIfNotExists waits for it; then it goes on to the
// FOREIGN KEY, and commits once the deadlock is resolved.
func TestCreateIfNotExistsSchemaUpgradeDeadlock(t *testing.T) {
	const v1 = `CREATE TABLE IF NOT EXISTS account (id BIGINT PRIMARY KEY, owner TEXT NOT NULL)`
	const index = `CREATE INDEX IF NOT EXISTS account_by_owner ON account (owner)`
	const transfer = `CREATE TABLE IF NOT EXISTS transfer (id BIGINT PRIMARY KEY, account BIGINT NOT NULL REFERENCES account (id))`
	v2 := v1 + ";\n" + index + ";\n" + transfer
	db := pg.NewDB(t)
	db.SetMaxOpenConns(4)
	if err := guard.CreateIfNotExists(ctx(t), db, v1); err != nil {
		t.Fatal(err)
	}
	other, pid := holdCreate(t, db, v1, index)
	done := make(chan error, 1)
	go func() { done <- guard.CreateIfNotExists(ctx(t), db, v2) }()
	waitBlockedBy(t, db, pid, "SELECT pg_advisory_xact_lock")
	_, otherErr := other.ExecContext(ctx(t), transfer)
	if otherErr == nil {
		otherErr = other.Commit()
	}
	err := <-done
	t.Logf("the other worker's run: %v", otherErr)
	if err != nil {
		t.Fatalf("CreateIfNotExists of schema v2 while another worker runs it = %v (SQLSTATE %s), want nil", err, sqlState(err))
	}
}

// counting wraps a Querier in a type of the caller's, as sqlx.Tx (which
// embeds *sql.Tx) or a tracing wrapper does, and counts the statements run
// through it.
type counting struct {
	guard.Querier
	execs atomic.Int64
}

func (c *counting) ExecContext(cx context.Context, query string, args ...any) (sql.Result, error) {
	c.execs.Add(1)
	return c.Querier.ExecContext(cx, query, args...)
}

// TestCreateIfNotExistsWrappedTx: inside a transaction that is not a
// *sql.Tx itself (sqlx.Tx, a tracing wrapper), while another worker's run
// is paused before its commit: the run waits for it, then finds the table,
// running the statement once.
func TestCreateIfNotExistsWrappedTx(t *testing.T) {
	db := pg.NewDB(t)
	db.SetMaxOpenConns(4)
	const stmt = `CREATE TABLE IF NOT EXISTS shared (id INT)`
	other, pid := holdCreate(t, db, stmt)
	tx, err := db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	w := &counting{Querier: tx}
	done := make(chan error, 1)
	go func() { done <- guard.CreateIfNotExists(ctx(t), w, stmt) }()
	waitBlockedBy(t, db, pid, "SELECT pg_advisory_xact_lock")
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if err != nil {
		t.Errorf("CreateIfNotExists in a wrapped *sql.Tx, after another worker's run = %v (SQLSTATE %q), want nil", err, sqlState(err))
	}
	if n := w.execs.Load(); n != 1 {
		t.Errorf("CreateIfNotExists ran the statement %d times, want 1", n)
	}
}

// TestCreateIfNotExistsRealErrorRunOnce: a CREATE UNIQUE INDEX IF NOT
// EXISTS over rows that are not unique fails with 23505, the SQLSTATE of a
// lost creation race too; so does a CREATE TABLE whose primary key index
// is named (by the schema) like an existing relation (42P07). No concurrent creator is
// there, running again cannot help, and on a big table each run is a
// whole index build: CreateIfNotExists should run it once and return
// the error as it is.
func TestCreateIfNotExistsRealErrorRunOnce(t *testing.T) {
	db := pg.NewDB(t)
	for _, stmt := range []string{
		`CREATE TABLE dup (v INT)`,
		`INSERT INTO dup SELECT g % 10 FROM generate_series(1, 100000) g`,
		`CREATE TABLE taken_pkey (id INT)`,
	} {
		if _, err := db.ExecContext(ctx(t), stmt); err != nil {
			t.Fatal(err)
		}
	}
	for _, stmt := range []string{
		`CREATE UNIQUE INDEX IF NOT EXISTS dup_v ON dup (v)`,
		`CREATE TABLE IF NOT EXISTS taken (id INT CONSTRAINT taken_pkey PRIMARY KEY)`,
	} {
		c := &counting{Querier: db}
		err := guard.CreateIfNotExists(ctx(t), c, stmt)
		if err == nil {
			t.Fatalf("%s: no error", stmt)
		}
		t.Logf("%s: %v", stmt, err)
		if n := c.execs.Load(); n != 1 {
			t.Errorf("%s: an error that is no race (SQLSTATE %s, nothing else runs) was run %d times, want 1", stmt, sqlState(err), n)
		}
	}
}

// TestCreateIfNotExistsManyShapes32: 32 workers at once run schemas of
// many shapes (schema, sequence, identity and serial columns, indexes,
// a materialized view, CREATE TABLE AS), each as separate statements and
// all in one string, through *sql.DB and *sql.Conn.
func TestCreateIfNotExistsManyShapes32(t *testing.T) {
	stmts := []string{
		`CREATE SCHEMA IF NOT EXISTS app`,
		`CREATE SEQUENCE IF NOT EXISTS app.ids`,
		`CREATE TABLE IF NOT EXISTS app.item (
			seq  BIGINT GENERATED ALWAYS AS IDENTITY,
			n    BIGSERIAL,
			id   TEXT PRIMARY KEY,
			kind TEXT NOT NULL DEFAULT 'x' UNIQUE
		)`,
		`CREATE INDEX IF NOT EXISTS item_by_kind_seq ON app.item (kind, seq)`,
		`CREATE UNIQUE INDEX IF NOT EXISTS item_by_n ON app.item (n)`,
		`CREATE TABLE IF NOT EXISTS app.snapshot AS SELECT id, kind FROM app.item`,
		`CREATE MATERIALIZED VIEW IF NOT EXISTS app.kinds AS SELECT kind, count(*) FROM app.item GROUP BY kind`,
	}
	const workers = 32
	for _, shape := range []string{"separate", "one string"} {
		for _, via := range []string{"DB", "Conn"} {
			t.Run(shape+"/"+via, func(t *testing.T) {
				for round := range 3 {
					db := pg.NewDB(t)
					db.SetMaxOpenConns(workers)
					args := stmts
					if shape == "one string" {
						args = []string{strings.Join(stmts, ";\n")}
					}
					errs := atOnce(workers, func(_ int, start <-chan struct{}) error {
						var q guard.Querier = db
						if via == "Conn" {
							conn, err := db.Conn(ctx(t))
							if err != nil {
								return err
							}
							defer conn.Close()
							q = conn
						}
						<-start
						return guard.CreateIfNotExists(ctx(t), q, args...)
					})
					for i, err := range errs {
						if err != nil {
							t.Errorf("round %d worker %d: %v (SQLSTATE %s)", round, i, err, sqlState(err))
						}
					}
					if _, err := db.ExecContext(ctx(t), `INSERT INTO app.item (id) VALUES ('a')`); err != nil {
						t.Errorf("round %d: %v", round, err)
					}
				}
			})
		}
	}
}

// TestCreateIfNotExistsDifferentStringsAtOnce: two services (or two
// versions of one) share a database and two tables, and create them in
// strings of their own, in a different order: the runs may deadlock
// (40P01), and CreateIfNotExists returns that.
func TestCreateIfNotExistsDifferentStringsAtOnce(t *testing.T) {
	a := `CREATE TABLE IF NOT EXISTS ledger (id BIGINT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS journal (id BIGINT PRIMARY KEY)`
	b := `CREATE TABLE IF NOT EXISTS journal (id BIGINT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS ledger (id BIGINT PRIMARY KEY)`
	const workers = 16
	failed := 0
	for round := range 5 {
		db := pg.NewDB(t)
		db.SetMaxOpenConns(workers)
		for _, err := range atOnce(workers, func(i int, start <-chan struct{}) error {
			<-start
			stmt := a
			if i%2 == 1 {
				stmt = b
			}
			return guard.CreateIfNotExists(ctx(t), db, stmt)
		}) {
			if err != nil {
				failed++
				t.Errorf("round %d: %v (SQLSTATE %s)", round, err, sqlState(err))
			}
		}
	}
	if failed > 0 {
		t.Logf("%d of %d calls failed", failed, 5*workers)
	}
}

// TestCreateIfNotExistsContextEndsWhileWaiting: a run that waits for a
// concurrent creator returns when its context ends, with the context's
// error (not retried, not hidden).
func TestCreateIfNotExistsContextEndsWhileWaiting(t *testing.T) {
	db := pg.NewDB(t)
	db.SetMaxOpenConns(4)
	const stmt = `CREATE TABLE IF NOT EXISTS slow (id INT)`
	_, pid := holdCreate(t, db, stmt)
	c, cancel := context.WithCancel(ctx(t))
	c2 := &counting{Querier: db}
	done := make(chan error, 1)
	go func() { done <- guard.CreateIfNotExists(c, c2, stmt) }()
	waitBlockedBy(t, db, pid, "SELECT pg_advisory_xact_lock")
	began := time.Now()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("CreateIfNotExists after its ctx was cancelled = %v, want context.Canceled", err)
		}
		if n := c2.execs.Load(); n != 1 {
			t.Errorf("ran %d times, want 1", n)
		}
		t.Logf("returned %v after the cancel: %v", time.Since(began), err)
	case <-time.After(10 * time.Second):
		t.Fatal("CreateIfNotExists still waits 10 s after its ctx was cancelled")
	}
}

// TestCreateIfNotExistsSQLiteManyProcesses: 32 processes (each its own
// *sql.DB, as separate workers have) open one fresh SQLite file with
// guard.SQLiteDSN and create the payment example's schema and the guard's
// tables at once.
func TestCreateIfNotExistsSQLiteManyProcesses(t *testing.T) {
	const schema = `
CREATE TABLE IF NOT EXISTS payment (
	id                 BIGINT PRIMARY KEY,
	amount             BIGINT NOT NULL,
	status             TEXT   NOT NULL DEFAULT 'PENDING',
	approved_by        TEXT,
	last_fencing_token BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS charge (
	payment_id BIGINT NOT NULL,
	amount     BIGINT NOT NULL,
	charged_by TEXT   NOT NULL,
	token      BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS charge_by_payment ON charge (payment_id)`
	const workers = 32
	for round := range 3 {
		path := filepath.Join(t.TempDir(), "shared.db")
		errs := atOnce(workers, func(_ int, start <-chan struct{}) error {
			db, err := sql.Open("sqlite", guard.SQLiteDSN(path))
			if err != nil {
				return err
			}
			defer db.Close()
			<-start
			if err := guard.CreateIfNotExists(ctx(t), db, schema); err != nil {
				return err
			}
			return guard.CreateTables(ctx(t), db)
		})
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d process %d: %v", round, i, err)
			}
		}
	}
}
