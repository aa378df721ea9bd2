package queue_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/queue"
)

// asRole creates a role granted the rows of the queue's and the guard's
// tables and what else is in grants, and switches every connection of db
// to it (one connection, so that every statement runs as the role): a
// consumer that runs as least privilege, the tables made by a migration
// role (the database's owner).
func asRole(t *testing.T, ctx context.Context, db *sql.DB, grants ...string) {
	t.Helper()
	asRoleGranted(t, ctx, db, append([]string{`GRANT SELECT, INSERT, UPDATE, DELETE ON queue_applied, queue_balance, queue_dead, queue_failures, fence_tokens, fence_idempotency`}, grants...)...)
}

// asRoleGranted is asRole with grants alone, the tables' rows among them.
func asRoleGranted(t *testing.T, ctx context.Context, db *sql.DB, grants ...string) {
	t.Helper()
	role := "queue_rw_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	stmts := []string{
		`CREATE ROLE ` + role,
		`REVOKE CREATE ON SCHEMA public FROM PUBLIC`,
		`GRANT USAGE ON SCHEMA public TO ` + role,
	}
	for _, g := range grants {
		stmts = append(stmts, g+` TO `+role)
	}
	for _, stmt := range stmts {
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
	var who string
	if err := db.QueryRowContext(ctx, `SELECT current_user`).Scan(&who); err != nil || who != role {
		t.Fatalf("current_user %q (%v), want %s", who, err, role)
	}
}

// TestCreateSchemaWithoutCreateOnSchema: the queue's tables were made by a
// migration role, and the consumers run as a role granted their rows and
// the schema's USAGE, not CREATE on it (PostgreSQL 15's default on public
// for all but its owner), as the payment example's paymentd may. Every
// consumer calls CreateSchema as it starts (cmd/queued does, and exits
// when it fails). Before, it failed: "permission denied for schema public
// (SQLSTATE 42501)", from CREATE TABLE IF NOT EXISTS queue_applied, the
// table there (PostgreSQL checks the privilege before it looks). With
// everything in place it must create nothing.
func TestCreateSchemaWithoutCreateOnSchema(t *testing.T) {
	ctx, _, db := servers(t, 30*time.Second)
	asRole(t, ctx, db)
	if err := queue.CreateSchema(ctx, db); err != nil {
		t.Fatalf("CreateSchema as a role without CREATE on the schema, every table, column and index there: %v; want nil", err)
	}
}

// TestCreateSchemaNotOwnerIndexMissing: a database upgraded from before
// queue_applied_entry_id by consumers alone, which run as a role granted
// the tables' rows and CREATE on the schema but not owning the tables:
// their CreateSchema, which found everything there before that index,
// now fails to create it ("must be owner of table queue_applied (SQLSTATE
// 42501)"), and the consumers do not start. The index serves only the
// look-up of entries trimmed while pending; without it that look-up reads
// the table. Decided: such a role goes on without the index (the owner's
// next CreateSchema makes it), as the table's owner alone may make it.
func TestCreateSchemaNotOwnerIndexMissing(t *testing.T) {
	ctx, _, db := servers(t, 30*time.Second)
	if _, err := db.ExecContext(ctx, `DROP INDEX queue_applied_entry_id`); err != nil {
		t.Fatal(err)
	}
	asRole(t, ctx, db, `GRANT CREATE ON SCHEMA public`)
	if err := queue.CreateSchema(ctx, db); err != nil {
		t.Fatalf("CreateSchema as a role that does not own the tables, the index missing: %v; want nil", err)
	}
	// The owner's next CreateSchema makes it.
	if _, err := db.ExecContext(ctx, `RESET ROLE`); err != nil {
		t.Fatal(err)
	}
	if err := queue.CreateSchema(ctx, db); err != nil {
		t.Fatalf("CreateSchema as the owner: %v", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_indexes WHERE indexname = 'queue_applied_entry_id'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("queue_applied_entry_id after the owner's CreateSchema: %d (%v), want 1", n, err)
	}
}
