package guard_test

import (
	"database/sql"
	"errors"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// TestNondeterministicCollationKeys: a PostgreSQL business table whose key
// column has a case-insensitive (nondeterministic) collation, so that
// 'PAY-ABC' and 'pay-abc' are one row. Table.Update keeps the token in the
// row, and refuses token 5 through either spelling after 9 (held). Tx
// fences a resource name that the caller builds: "payment:" plus the key
// as the client spelled it names two fence_tokens rows for the one
// payment, and token 5 wrote it after token 9 had. Tx's doc says to build
// the name from the key as the database compares it.
func TestNondeterministicCollationKeys(t *testing.T) {
	db := pg.NewDB(t)
	var icu int
	if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_collation WHERE collprovider = 'i'`).Scan(&icu); err != nil {
		t.Fatal(err)
	}
	if icu == 0 {
		t.Fatal("this PostgreSQL has no ICU collations")
	}
	for _, stmt := range []string{
		`CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`,
		`CREATE TABLE payment (id TEXT COLLATE ci PRIMARY KEY, approved_by TEXT, last_fencing_token BIGINT)`,
		`INSERT INTO payment (id) VALUES ('PAY-ABC')`,
	} {
		if _, err := db.ExecContext(ctx(t), stmt); err != nil {
			t.Fatal(err)
		}
	}
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	tb := guard.Table{Name: "payment", Key: "id", Column: "last_fencing_token"}
	if err := tb.Update(ctx(t), db, "PAY-ABC", 9, "approved_by = $3", "w9"); err != nil {
		t.Fatal(err)
	}
	if err := tb.Update(ctx(t), db, "pay-abc", 5, "approved_by = $3", "w5"); !errors.Is(err, guard.ErrStale) {
		t.Errorf("Table.Update token 5 through the key's other spelling, after 9: %v; want ErrStale", err)
	}

	approve := func(key string, token int64, by string) error {
		return guard.Tx(ctx(t), db, "payment:"+key, fence.Token(token), func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx(t), `UPDATE payment SET approved_by = $1 WHERE id = $2`, by, key)
			return err
		})
	}
	if err := approve("PAY-ABC", 19, "t19"); err != nil {
		t.Fatal(err)
	}
	err := approve("pay-abc", 15, "t15")
	var by string
	if err := db.QueryRowContext(ctx(t), `SELECT approved_by FROM payment`).Scan(&by); err != nil {
		t.Fatal(err)
	}
	t.Logf("Tx on the resource built from the other spelling: token 15 after 19: %v; approved_by %q", err, by)
	if err == nil && by == "t15" {
		t.Log("as Tx's doc warns: one row, two resource names")
	}
}
