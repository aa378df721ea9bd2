package guard_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fencekit/fence/guard"
)

// TestCreateTablesWithoutCreateOnSchema: a migration role made the guard's
// tables, and the service runs as a role granted only what it uses: the
// tables' rows and the schema's USAGE, not CREATE on the schema (which
// PostgreSQL 15 no longer gives every role on public). Such a service,
// calling CreateTables at start-up as the payment example does, must start:
// the tables are there. Before, CreateTables failed with "permission denied
// for schema public (SQLSTATE 42501)", though Fence worked: PostgreSQL
// checks CREATE on the schema before it looks whether the table of a
// CREATE TABLE IF NOT EXISTS exists.
func TestCreateTablesWithoutCreateOnSchema(t *testing.T) {
	db := pg.NewDB(t)
	role := "guard_rw_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, stmt := range []string{
		`CREATE TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL CHECK (token > 0), call_id TEXT)`,
		`CREATE TABLE fence_idempotency (key TEXT PRIMARY KEY)`,
		`CREATE ROLE ` + role,
		`GRANT SELECT, INSERT, UPDATE ON fence_tokens, fence_idempotency TO ` + role,
		`REVOKE CREATE ON SCHEMA public FROM PUBLIC`,
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
	conn, err := db.Conn(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx(t), `SET ROLE `+role); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.ExecContext(context.Background(), `RESET ROLE`) }()
	if err := guard.CreateTables(ctx(t), conn); err != nil {
		t.Fatalf("CreateTables as a role without CREATE on the schema, the tables there: %v; want nil", err)
	}
	if err := guard.Fence(guard.WithCall(ctx(t), "c1"), conn, "r", 5); err != nil {
		t.Fatalf("Fence: %v", err)
	}
	if err := guard.Once(ctx(t), conn, "k1"); err != nil {
		t.Fatalf("Once: %v", err)
	}
}
