package queue_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/queue"
)

// asOwnSchemaRole creates a role granted the rows of the queue's and the
// guard's tables, owning a schema of its own name, which PostgreSQL's
// default search_path ("$user", public) puts before public, where the
// migration role made the tables; it switches db's one connection to the
// role and returns the role's name.
func asOwnSchemaRole(t *testing.T, ctx context.Context, db *sql.DB) string {
	t.Helper()
	role := "queued_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, stmt := range []string{
		`CREATE ROLE ` + role,
		`CREATE SCHEMA AUTHORIZATION ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON queue_applied, queue_balance, queue_dead, queue_failures, fence_tokens, fence_idempotency TO ` + role,
		`GRANT USAGE ON SCHEMA public TO ` + role,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() {
		for _, stmt := range []string{`RESET ROLE`, `DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			if _, err := db.ExecContext(context.Background(), stmt); err != nil {
				t.Error(err)
			}
		}
	})
	if _, err := db.ExecContext(ctx, `SET ROLE `+role); err != nil {
		t.Fatal(err)
	}
	return role
}

// madeIn returns the names of the tables in schema.
func madeIn(t *testing.T, ctx context.Context, db *sql.DB, schema string) []string {
	t.Helper()
	rows, err := db.QueryContext(ctx, `SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = $1 ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// TestCreateSchemaWithOwnSchemaFirstOnPath: the migration role made the
// queue's tables in public; the consumers' role owns a schema of its own
// name, first on PostgreSQL's default search_path. CreateSchema looked for
// the tables in current_schema(), the role's, found none and made empty
// queue_applied, queue_balance, queue_dead and queue_failures there, which
// every unqualified statement of the consumer then used: messages applied
// before were not found applied (applied again), and balances were split
// between two tables. The tables visible on the path are the ones to
// count, as guard.CreateTables and payment.CreateSchema count theirs.
func TestCreateSchemaWithOwnSchemaFirstOnPath(t *testing.T) {
	ctx, _, db := servers(t, 30*time.Second)
	role := asOwnSchemaRole(t, ctx, db)
	if err := queue.CreateSchema(ctx, db); err != nil {
		t.Fatalf("CreateSchema as %s: %v", role, err)
	}
	if made := madeIn(t, ctx, db, role); len(made) != 0 {
		t.Errorf("CreateSchema as %s made %v in its own schema, want nothing (public's are on its path)", role, made)
	}
}

// TestCreateSchemaUpgradeWithOwnSchemaFirstOnPath: as above, on a database
// from before queue_dead.entry_id, so that the consumers' role runs Schema
// (the upgrade, which takes the tables' owner). Schema's CREATE TABLE IF
// NOT EXISTS looks in current_schema() alone: it made the four tables in
// the role's schema, and its column check, there too, found entry_id in
// them, so the role's consumers started on empty tables and public's
// stayed without the column. The role may not upgrade public's tables: it
// must make nothing, and say so.
func TestCreateSchemaUpgradeWithOwnSchemaFirstOnPath(t *testing.T) {
	ctx, _, db := servers(t, 30*time.Second)
	if _, err := db.ExecContext(ctx, `ALTER TABLE queue_dead DROP COLUMN entry_id`); err != nil {
		t.Fatal(err)
	}
	role := asOwnSchemaRole(t, ctx, db)
	err := queue.CreateSchema(ctx, db)
	if made := madeIn(t, ctx, db, role); len(made) != 0 {
		t.Errorf("CreateSchema as %s made %v in its own schema (returned %v), want nothing", role, made, err)
	}
	if err == nil {
		t.Errorf("CreateSchema as %s, not the owner of public.queue_dead, which has no entry_id: nil, want an error", role)
	}
}
