package guard_test

import (
	"database/sql"
	"errors"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// TestUpdateTokenColumnOfOtherTypes: Table.Update on a business table
// whose token column a careless schema declared as something other than
// BIGINT. On SQLite a TEXT (or VARCHAR) column has TEXT affinity, and
// "tok < $2" compared the stored '1800000000000003' with token 9 as text:
// '1' < '9', so token 9 was accepted after 1800000000000003, and then
// token 20 found "no such row" ('9' < '20' is false as text). Whatever the
// column's type, a token not greater than an accepted one must never be
// accepted; an error is acceptable, an acceptance is not. (On PostgreSQL
// an INTEGER, TEXT or TIMESTAMP column fails to encode the token, and a
// REAL one compares tokens rounded to float4: newer tokens within its
// precision are refused, never older ones accepted.)
func TestUpdateTokenColumnOfOtherTypes(t *testing.T) {
	for name, db := range databases(t) {
		for i, typ := range []string{"BIGINT", "INTEGER", "TEXT", "VARCHAR(40)", "REAL", "DOUBLE PRECISION", "NUMERIC(20)", ""} {
			tbl := "tokcol" + string(rune('a'+i))
			if _, err := db.ExecContext(ctx(t), `CREATE TABLE `+tbl+` (id INTEGER PRIMARY KEY, v TEXT, tok `+typ+`)`); err != nil {
				t.Logf("%s: column type %q refused: %v", name, typ, err)
				continue
			}
			if _, err := db.ExecContext(ctx(t), `INSERT INTO `+tbl+` (id, v) VALUES (1, 'x')`); err != nil {
				t.Fatal(err)
			}
			tb := guard.Table{Name: tbl, Key: "id", Column: "tok"}
			var greatest fence.Token
			for _, tok := range []fence.Token{1_800_000_000_000_002, 1_800_000_000_000_001, 1_800_000_000_000_003, 9, 20, 1_800_000_000_000_003, 1_900_000_000_000_000} {
				err := tb.Update(ctx(t), db, 1, tok, "v = $3", "w")
				switch {
				case err == nil && tok <= greatest:
					t.Errorf("%s, token column %q: token %d accepted after %d", name, typ, tok, greatest)
				case err == nil:
					greatest = tok
				case tok <= greatest && !errors.Is(err, guard.ErrStale):
					t.Logf("%s, token column %q: token %d refused with %v (not ErrStale)", name, typ, tok, err)
				case tok > greatest:
					t.Logf("%s, token column %q: token %d, greater than %d, refused: %v", name, typ, tok, greatest, err)
				}
			}
		}
	}
}

// TestFenceTokensTableOfOtherTypes: a fence_tokens table that a migration
// of the service's own created before CreateTables (which then leaves it
// as it is), with a token column declared TEXT. On SQLite the upsert's
// "fence_tokens.token < excluded.token" compared as text, and Tx accepted
// token 9 after 1800000000000003.
func TestFenceTokensTableOfOtherTypes(t *testing.T) {
	for name, db := range databases(t) {
		for _, typ := range []string{"TEXT", "VARCHAR(40)"} {
			t.Run(name+"/"+typ, func(t *testing.T) {
				for _, stmt := range []string{`DROP TABLE IF EXISTS fence_tokens`, `CREATE TABLE fence_tokens (resource TEXT PRIMARY KEY, token ` + typ + ` NOT NULL)`} {
					if _, err := db.ExecContext(ctx(t), stmt); err != nil {
						t.Fatal(err)
					}
				}
				if err := guard.CreateTables(ctx(t), db); err != nil {
					t.Fatal(err)
				}
				var greatest fence.Token
				for _, tok := range []fence.Token{1_800_000_000_000_003, 9, 20, 1_800_000_000_000_003, 1_900_000_000_000_000} {
					err := guard.Tx(ctx(t), db, "payment:1001", tok, func(*sql.Tx) error { return nil })
					switch {
					case err == nil && tok <= greatest:
						t.Errorf("token %d accepted after %d", tok, greatest)
					case err == nil:
						greatest = tok
					default:
						t.Logf("token %d: %v", tok, err)
					}
				}
			})
		}
	}
}
