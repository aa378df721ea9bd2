package payment_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/payment"
	"github.com/fencekit/fence/guard"
)

// TestCreateSchemaWithOwnSchemaFirstOnPath: the migration role made the
// tables in public; paymentd's role owns a schema of its own name, which
// PostgreSQL's default search_path ("$user", public) puts first. The
// tables were counted in current_schema(), paymentd's, where there were
// none, so CreateSchema created an empty payment, charge and guard tables
// there (pg_tables then listed payment, charge, fence_tokens and
// fence_idempotency in both schemas), and every unqualified query of the
// service found them, not public's: "Get(1001) after CreateSchema:
// payment: no such payment: 1001". Worse, workers of that role and of
// others fenced one payment in two fence_tokens tables, which order
// nothing between them. CreateSchema and guard.CreateTables now take a
// table as there when it is visible on the path (to_regclass): the role
// uses public's tables, creates none of its own, and its fences and the
// migration role's are ordered in one fence_tokens.
func TestCreateSchemaWithOwnSchemaFirstOnPath(t *testing.T) {
	db := pg.NewDB(t)
	if err := payment.CreateSchema(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	if err := payment.Insert(ctx(t), db, 1001, 5000); err != nil {
		t.Fatal(err)
	}
	role := "paymentd_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, stmt := range []string{
		`CREATE ROLE ` + role,
		`CREATE SCHEMA AUTHORIZATION ` + role,
		`GRANT SELECT, INSERT, UPDATE ON payment, charge, fence_tokens, fence_idempotency TO ` + role,
		`GRANT USAGE ON SCHEMA public TO ` + role,
	} {
		if _, err := db.ExecContext(ctx(t), stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, stmt := range []string{`DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			if _, err := db.ExecContext(context.Background(), stmt); err != nil {
				t.Error(err)
			}
		}
	})
	// One connection, so that every statement runs as the role.
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx(t), `SET ROLE `+role); err != nil {
		t.Fatal(err)
	}
	if err := conn.Close(); err != nil { // back to the pool, role and all
		t.Fatal(err)
	}
	defer func() { _, _ = db.ExecContext(context.Background(), `RESET ROLE`) }()
	if err := payment.CreateSchema(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	if _, err := payment.Get(ctx(t), db, 1001); err != nil {
		t.Fatalf("Get(1001) after CreateSchema: %v", err)
	}
	var made int
	if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = $1`, role).Scan(&made); err != nil || made != 0 {
		t.Errorf("CreateSchema as %s made %d tables in its own schema (%v), want none", role, made, err)
	}
	// The migration role, on a connection of its own, and paymentd's role
	// fence the same resource: one table orders them.
	var name string
	if err := db.QueryRowContext(ctx(t), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	migration, err := sql.Open("pgx", pg.DSN(name))
	if err != nil {
		t.Fatal(err)
	}
	defer migration.Close()
	if err := guard.Fence(ctx(t), migration, "payment:1001", 9); err != nil {
		t.Fatalf("Fence 9 as the migration role: %v", err)
	}
	if err := guard.Fence(ctx(t), db, "payment:1001", 5); !errors.Is(err, guard.ErrStale) {
		t.Errorf("Fence 5 as %s after 9 as the migration role: %v, want guard.ErrStale", role, err)
	}
	if err := guard.Fence(ctx(t), db, "payment:1001", 10); err != nil {
		t.Fatalf("Fence 10 as %s: %v", role, err)
	}
	if err := guard.Fence(ctx(t), migration, "payment:1001", 9); !errors.Is(err, guard.ErrStale) {
		t.Errorf("Fence 9 again as the migration role after 10 as %s: %v, want guard.ErrStale", role, err)
	}
}

// TestCreateSchemaRaceWithCreatorOnPath: two services start at once on a
// fresh database, one on the default path (public), one whose own schema
// svc_b comes first (svc_b, public). The first takes CreateIfNotExists's
// lock and makes the tables in public; the second had counted the visible
// tables before it waited for that lock, found none, and then ran
// Schema's CREATE TABLE IF NOT EXISTS, which looks in svc_b alone: an
// empty payment and charge there (2 tables in svc_b), which its Get and
// approvals then used. The count must be made again under the lock.
func TestCreateSchemaRaceWithCreatorOnPath(t *testing.T) {
	db := pg.NewDB(t)
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
	defer other.Close()
	// The first service, inside its CreateIfNotExists: it holds the lock.
	first, err := db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback()
	if _, err := first.ExecContext(ctx(t), `SELECT pg_advisory_xact_lock(1717923427, 1935894629)`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- payment.CreateSchema(ctx(t), other) }()
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
			t.Fatal("the second CreateSchema never waited for the schema lock")
		}
		select {
		case err := <-done:
			t.Fatalf("the second CreateSchema returned %v without waiting for the schema lock", err)
		case <-tick.C:
		}
	}
	if err := guard.CreateIfNotExists(ctx(t), first, payment.Schema); err != nil {
		t.Fatal(err)
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
	var made int
	if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'svc_b'`).Scan(&made); err != nil || made != 0 {
		t.Errorf("CreateSchema through svc_b,public, racing one that made public's: %d tables in svc_b (%v), want none", made, err)
	}
}
