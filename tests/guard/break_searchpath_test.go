package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/guard"
)

// svcB returns a fresh database, its name, and a second pool on it whose
// search_path is svc_b, public: a service whose own schema comes first.
func svcB(t *testing.T) (db, other *sql.DB) {
	t.Helper()
	db = pg.NewDB(t)
	var name string
	if err := db.QueryRowContext(ctx(t), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx(t), `CREATE SCHEMA svc_b`); err != nil {
		t.Fatal(err)
	}
	other, err := sql.Open("pgx", pg.DSN(name)+"&search_path=svc_b,public")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	return db, other
}

func tablesIn(t *testing.T, db *sql.DB, schema string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = $1`, schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCreateTablesRaceWithCreatorOnPath: two services start at once on a
// fresh database, one on the default path (public), one whose own schema
// svc_b comes first (svc_b, public). The first takes CreateIfNotExists's
// lock and creates the tables in public; the second looked for visible
// tables before it waited for that lock, found none, and once it had the
// lock ran CREATE TABLE IF NOT EXISTS, which looks in svc_b alone: it made
// a second fence_tokens there (2 tables in svc_b), and the two services'
// tokens for one resource ordered nothing. The look-up must be made under
// the lock.
func TestCreateTablesRaceWithCreatorOnPath(t *testing.T) {
	db, other := svcB(t)
	first, err := db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback()
	if _, err := first.ExecContext(ctx(t), `SELECT pg_advisory_xact_lock(1717923427, 1935894629)`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- guard.CreateTables(ctx(t), other) }()
	// Wait until the second service waits for the lock: it has looked.
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting int
		if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second CreateTables never waited for the schema lock")
		}
		select {
		case err := <-done:
			t.Fatalf("the second CreateTables returned %v without waiting for the schema lock", err)
		case <-tick.C:
		}
	}
	if err := guard.CreateTables(ctx(t), first); err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := tablesIn(t, db, "svc_b"); n != 0 {
		t.Errorf("CreateTables through svc_b,public, racing one that made public's: %d tables in svc_b, want none", n)
	}
}

// failingLookup is a Querier whose first QueryRowContext (CreateTables's
// look-up of the visible tables) fails on PostgreSQL, with an error that
// has a SQLSTATE, as a statement_timeout or an aborted transaction would.
type failingLookup struct {
	*sql.DB
	failed bool
}

func (q *failingLookup) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if !q.failed {
		q.failed = true
		return q.DB.QueryRowContext(ctx, `SELECT 1/0, 1/0`)
	}
	return q.DB.QueryRowContext(ctx, query, args...)
}

// TestCreateTablesLookupErrorNotSQLite: CreateTables took any error of its
// look-up for SQLite's (to_regclass unknown) and ran both CREATE TABLE IF
// NOT EXISTS: on PostgreSQL, through svc_b, public with public's tables
// there, a look-up that failed once (here 22012) made a second, empty
// fence_tokens in svc_b (2 tables) and returned nil. A PostgreSQL error
// (it has a SQLSTATE) must be returned, and nothing made.
func TestCreateTablesLookupErrorNotSQLite(t *testing.T) {
	db, other := svcB(t)
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	err := guard.CreateTables(ctx(t), &failingLookup{DB: other})
	if n := tablesIn(t, db, "svc_b"); n != 0 || err == nil {
		t.Errorf("CreateTables through svc_b,public, its look-up failing on PostgreSQL: %v, %d tables in svc_b; want the error and none", err, n)
	}
}

// TestCreateTablesTempTableShadows: a session with a TEMP table named
// fence_tokens (pg_temp comes first on every path, implicitly) fenced
// into it: CreateTables took it as the table (to_regclass finds it) and
// created nothing, and every unqualified statement of Fence used it. Its
// tokens die with the session and order nothing with other sessions':
// token 5 on another connection was accepted after 9 here. CreateTables
// must refuse it (ErrInvalidTable), as it refuses an UNLOGGED one, whose
// rows a crash empties.
func TestCreateTablesTempTableShadows(t *testing.T) {
	db := pg.NewDB(t)
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx(t), `CREATE TEMP TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL, call_id TEXT)`); err != nil {
		t.Fatal(err)
	}
	if err := guard.CreateTables(ctx(t), conn); !errors.Is(err, guard.ErrInvalidTable) {
		t.Errorf("CreateTables on a session with a TEMP fence_tokens: %v, want guard.ErrInvalidTable", err)
		if err := guard.Fence(ctx(t), conn, "payment:1001", 9); err != nil {
			t.Fatal(err)
		}
		if err := guard.Fence(ctx(t), db, "payment:1001", 5); !errors.Is(err, guard.ErrStale) {
			t.Errorf("Fence 5 on the shared table after 9 in a session's TEMP fence_tokens: %v, want guard.ErrStale", err)
		}
	}
}

// TestCreateTablesUnloggedRefused: an UNLOGGED fence_idempotency (or
// fence_tokens) is emptied when PostgreSQL restarts after a crash, and a
// used key is taken again: CreateTables refuses it, and accepts it once
// made permanent.
func TestCreateTablesUnloggedRefused(t *testing.T) {
	db := pg.NewDB(t)
	if _, err := db.ExecContext(ctx(t), `CREATE UNLOGGED TABLE fence_idempotency (key TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	err := guard.CreateTables(ctx(t), db)
	if !errors.Is(err, guard.ErrInvalidTable) || !strings.Contains(err.Error(), "SET LOGGED") {
		t.Fatalf("CreateTables with an UNLOGGED fence_idempotency: %v, want guard.ErrInvalidTable naming ALTER TABLE … SET LOGGED", err)
	}
	if n := tablesIn(t, db, "public"); n != 1 {
		t.Errorf("CreateTables refused but left %d tables in public, want the 1 there before", n)
	}
	if _, err := db.ExecContext(ctx(t), `ALTER TABLE fence_idempotency SET LOGGED`); err != nil {
		t.Fatal(err)
	}
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatalf("CreateTables once the table is permanent: %v", err)
	}
}
