package payment_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/payment"
)

// TestCreateSchemaWithOwnSchemaFirstOnPath: the migration role made the
// tables in public; paymentd's role owns a schema of its own name, which
// PostgreSQL's default search_path ("$user", public) puts first. The
// tables are counted in current_schema(), paymentd's, where there are
// none, so CreateSchema created an empty payment, charge and guard tables
// there (pg_tables then listed payment, charge, fence_tokens and
// fence_idempotency in both schemas), and every unqualified query of the
// service found them, not public's: "Get(1001) after CreateSchema:
// payment: no such payment: 1001".
//
// Skipped as a design question: counting the tables visible on the path
// instead (to_regclass) would leave public.payment in use, but
// guard.CreateTables counts its own in current_schema() on purpose (its
// doc) and would still make a fence_tokens in paymentd's schema: workers
// of that role and of others would then fence one payment row in two
// token tables, which order nothing between them (two charges). The two
// must decide together whether a table visible on the path counts.
func TestCreateSchemaWithOwnSchemaFirstOnPath(t *testing.T) {
	t.Skip("design question: CreateSchema (and guard.CreateTables) count tables in current_schema(): a role owning a schema of its name gets empty shadows of public's tables there; counting visible tables in payment alone would split the fence_tokens between roles")
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
}
