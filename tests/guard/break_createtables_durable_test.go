package guard_test

import (
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// TestCreateTablesTempFirstOnPathRefused: a connection whose search_path
// lists pg_temp first (search_path=pg_temp,public) creates unqualified
// tables as TEMP ones. On a fresh database CreateTables made both guard
// tables there and returned nil ('pg_temp_4.fence_tokens' and
// 'pg_temp_4.fence_idempotency', none in public): every session fenced
// into tables of its own, which order nothing between them. It must refuse
// what it made, as it refuses a TEMP table it finds.
func TestCreateTablesTempFirstOnPathRefused(t *testing.T) {
	db := pg.NewDB(t)
	var name string
	if err := db.QueryRowContext(ctx(t), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	tempFirst, err := sql.Open("pgx", pg.DSN(name)+"&search_path=pg_temp,public")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tempFirst.Close() })
	err = guard.CreateTables(ctx(t), tempFirst)
	if !errors.Is(err, guard.ErrInvalidTable) || !strings.Contains(err.Error(), "TEMP") {
		t.Errorf("CreateTables through search_path pg_temp,public on a fresh database: %v (%d tables in public), want guard.ErrInvalidTable naming the TEMP table", err, tablesIn(t, db, "public"))
	}
}

// TestCreateTablesUnloggedPartitionRefused: a partitioned fence_tokens is
// itself permanent (relpersistence p) whatever its partitions are, and
// CreateTables took one with an UNLOGGED partition (CreateTables = nil,
// then Fence = nil into it): the rows of that partition, half the
// resources, are emptied by a crash, as an UNLOGGED table's are. It must
// refuse it, naming the partition to SET LOGGED.
func TestCreateTablesUnloggedPartitionRefused(t *testing.T) {
	db := pg.NewDB(t)
	for _, stmt := range []string{
		`CREATE TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL, call_id TEXT) PARTITION BY HASH (resource)`,
		`CREATE TABLE fence_tokens_0 PARTITION OF fence_tokens FOR VALUES WITH (MODULUS 2, REMAINDER 0)`,
		`CREATE UNLOGGED TABLE fence_tokens_1 PARTITION OF fence_tokens FOR VALUES WITH (MODULUS 2, REMAINDER 1)`,
	} {
		if _, err := db.ExecContext(ctx(t), stmt); err != nil {
			t.Fatal(err)
		}
	}
	err := guard.CreateTables(ctx(t), db)
	if !errors.Is(err, guard.ErrInvalidTable) || !strings.Contains(err.Error(), "ALTER TABLE fence_tokens_1 SET LOGGED") {
		t.Fatalf("CreateTables with a fence_tokens partition UNLOGGED: %v, want guard.ErrInvalidTable naming ALTER TABLE fence_tokens_1 SET LOGGED", err)
	}
	if _, err := db.ExecContext(ctx(t), `ALTER TABLE fence_tokens_1 SET LOGGED`); err != nil {
		t.Fatal(err)
	}
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatalf("CreateTables once every partition is permanent: %v", err)
	}
}

// TestCreateTablesViewOverUnlogged: a view named fence_tokens is a
// permanent relation (relpersistence p) whatever it reads from, and
// Fence writes through an updatable one: over an UNLOGGED table,
// CreateTables = nil and Fence = nil, the tokens emptied by a crash.
// Decided: a view is allowed (a service may use one on purpose to reach a
// shared table), and what it reads is checked as the table would be, at
// every level of views and partitions.
func TestCreateTablesViewOverUnlogged(t *testing.T) {
	for _, c := range []struct {
		name    string
		stmts   []string
		refused bool
	}{
		{"view over UNLOGGED", []string{
			`CREATE UNLOGGED TABLE shared_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL, call_id TEXT)`,
			`CREATE VIEW fence_tokens AS SELECT * FROM shared_tokens`}, true},
		{"view over a view over UNLOGGED", []string{
			`CREATE UNLOGGED TABLE shared_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL, call_id TEXT)`,
			`CREATE VIEW middle AS SELECT * FROM shared_tokens`,
			`CREATE VIEW fence_tokens AS SELECT * FROM middle`}, true},
		{"view over a partitioned table with an UNLOGGED partition", []string{
			`CREATE TABLE shared_tokens (resource TEXT NOT NULL, token BIGINT NOT NULL, call_id TEXT, PRIMARY KEY (resource)) PARTITION BY HASH (resource)`,
			`CREATE TABLE shared_tokens_0 PARTITION OF shared_tokens FOR VALUES WITH (MODULUS 2, REMAINDER 0)`,
			`CREATE UNLOGGED TABLE shared_tokens_1 PARTITION OF shared_tokens FOR VALUES WITH (MODULUS 2, REMAINDER 1)`,
			`CREATE VIEW fence_tokens AS SELECT * FROM shared_tokens`}, true},
		{"view over a permanent table", []string{
			`CREATE TABLE shared_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL, call_id TEXT)`,
			`CREATE VIEW fence_tokens AS SELECT * FROM shared_tokens`}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := pg.NewDB(t)
			for _, stmt := range c.stmts {
				if _, err := db.ExecContext(ctx(t), stmt); err != nil {
					t.Fatal(err)
				}
			}
			err := guard.CreateTables(ctx(t), db)
			if c.refused {
				if !errors.Is(err, guard.ErrInvalidTable) || !strings.Contains(err.Error(), "shared_tokens") {
					t.Fatalf("CreateTables: %v, want guard.ErrInvalidTable naming the UNLOGGED table", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("CreateTables with fence_tokens a view over a permanent table: %v", err)
			}
			// Fence writes through the view, and refuses a stale token.
			for _, tok := range []fence.Token{5, 9} {
				if err := guard.Fence(ctx(t), db, "payment:1001", tok); err != nil {
					t.Fatal(err)
				}
			}
			if err := guard.Fence(ctx(t), db, "payment:1001", 7); !errors.Is(err, guard.ErrStale) {
				t.Fatalf("Fence 7 after 9 through the view: %v, want ErrStale", err)
			}
		})
	}
}

// TestCreateTablesSQLiteTempTableRefused: SQLite's TEMP tables shadow
// main's for their connection, as PostgreSQL's do for their session (and
// a name's case does not matter there). With a TEMP Fence_Tokens on one
// pooled connection, CreateTables on it returned nil, Fence 9 went to
// that TEMP table, and Fence 5 on another connection was accepted after
// it. CreateTables must refuse it there too.
func TestCreateTablesSQLiteTempTableRefused(t *testing.T) {
	db, err := sql.Open("sqlite", guard.SQLiteDSN(filepath.Join(t.TempDir(), "guard.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx(t), `CREATE TEMP TABLE Fence_Tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL, call_id TEXT)`); err != nil {
		t.Fatal(err)
	}
	err = guard.CreateTables(ctx(t), conn)
	if !errors.Is(err, guard.ErrInvalidTable) || !strings.Contains(err.Error(), "DROP TABLE temp.fence_tokens") {
		t.Errorf("CreateTables on SQLite with a TEMP Fence_Tokens: %v, want guard.ErrInvalidTable naming DROP TABLE temp.fence_tokens", err)
	}
}

// TestCreateTablesUnloggedMadeWhileWaiting: the look-up under
// CreateIfNotExists's lock (a DO block) asks only whether a table is
// there, not what it is. A CreateTables that found no table, then waited
// for the lock while another session made an UNLOGGED fence_tokens in
// public, took that table: it returned nil. What it finds under the lock
// must be refused as what it finds before.
func TestCreateTablesUnloggedMadeWhileWaiting(t *testing.T) {
	db := pg.NewDB(t)
	first, err := db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback()
	if _, err := first.ExecContext(ctx(t), `SELECT pg_advisory_xact_lock(1717923427, 1935894629)`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- guard.CreateTables(ctx(t), db) }()
	waitForAdvisoryWaiter(t, db, done)
	if _, err := first.ExecContext(ctx(t), `CREATE UNLOGGED TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL, call_id TEXT)`); err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, guard.ErrInvalidTable) || !strings.Contains(err.Error(), "SET LOGGED") {
		t.Errorf("CreateTables that waited while an UNLOGGED fence_tokens was made: %v, want guard.ErrInvalidTable naming ALTER TABLE … SET LOGGED", err)
	}
}

// waitForAdvisoryWaiter waits until a session waits for an advisory lock
// on db's database (CreateTables, for CreateIfNotExists's lock), failing
// t after 10 s or if the call returns first.
func waitForAdvisoryWaiter(t *testing.T, db *sql.DB, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting int
		if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("CreateTables never waited for the schema lock")
		}
		select {
		case err := <-done:
			t.Fatalf("CreateTables returned %v without waiting for the schema lock", err)
		case <-tick.C:
		}
	}
}

// TestCreateTablesDeleteRuleIntoUnloggedAccepted: a permanent fence_tokens
// whose deleted rows a rule copies into an UNLOGGED table (an operator's
// scratch record of what was pruned). The tokens are in fence_tokens,
// which a crash keeps, and Fence works with the rule; CreateTables
// accepted the table before it followed rules, and then refused it
// ("a table with an UNLOGGED partition, or a view reading an UNLOGGED
// table, pruned"): it followed every rule of every relation it reached,
// not only what a view reads and where an INSERT or UPDATE may go. A
// DELETE never writes a token.
func TestCreateTablesDeleteRuleIntoUnloggedAccepted(t *testing.T) {
	db := pg.NewDB(t)
	for _, stmt := range []string{
		`CREATE UNLOGGED TABLE pruned (resource TEXT, token BIGINT)`,
		`CREATE TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL, call_id TEXT)`,
		`CREATE RULE keep_pruned AS ON DELETE TO fence_tokens DO ALSO INSERT INTO pruned VALUES (OLD.resource, OLD.token)`,
	} {
		if _, err := db.ExecContext(ctx(t), stmt); err != nil {
			t.Fatal(err)
		}
	}
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatalf("CreateTables with a permanent fence_tokens and a DELETE rule into an UNLOGGED table: %v, want nil", err)
	}
	for _, tok := range []fence.Token{5, 9} {
		if err := guard.Fence(ctx(t), db, "payment:1001", tok); err != nil {
			t.Fatal(err)
		}
	}
	if err := guard.Fence(ctx(t), db, "payment:1001", 7); !errors.Is(err, guard.ErrStale) {
		t.Fatalf("Fence 7 after 9: %v, want ErrStale", err)
	}
}
