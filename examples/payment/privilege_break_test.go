package payment_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/payment"
)

// TestCreateSchemaWithoutCreateOnSchema: a migration role made the
// payment's and the guard's tables; paymentd runs as a role granted their
// rows and the schema's USAGE only, not CREATE on it (PostgreSQL 15's
// default on public for all but its owner). paymentd calls CreateSchema at
// start-up and exits when it fails. Seen: "ERROR: permission denied for
// schema public (SQLSTATE 42501)" from CREATE TABLE IF NOT EXISTS payment,
// the tables there: PostgreSQL checks the privilege before it looks
// whether the table exists. guard.CreateTables no longer fails so
// (TestCreateTablesWithoutCreateOnSchema in tests/guard); the example's
// own tables go through guard.CreateIfNotExists, which runs statements it
// cannot read and so cannot tell what exists.
func TestCreateSchemaWithoutCreateOnSchema(t *testing.T) {
	db := pg.NewDB(t)
	if err := payment.CreateSchema(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	role := "payment_rw_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, stmt := range []string{
		`CREATE ROLE ` + role,
		`GRANT SELECT, INSERT, UPDATE ON payment, charge, fence_tokens, fence_idempotency TO ` + role,
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
	var who string
	if err := db.QueryRowContext(ctx(t), `SELECT current_user`).Scan(&who); err != nil || who != role {
		t.Fatalf("current_user %q (%v), want %s", who, err, role)
	}
	if err := payment.CreateSchema(ctx(t), db); err != nil {
		t.Fatalf("CreateSchema as a role without CREATE on the schema, every table there: %v; want nil", err)
	}
}
