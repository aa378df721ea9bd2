package guard_test

import (
	"errors"
	"testing"

	"github.com/fencekit/fence/guard"
)

// TestUpdateOnColumnAddedLater: a careless schema change, the token column
// added to a table that has rows (ALTER TABLE … ADD COLUMN
// last_fencing_token BIGINT, nullable, no default), so that every existing
// row holds NULL. A row never fenced must take its first token, and a stale
// one must then be refused. Update used to fail on such a row for every
// token with a Scan error (converting NULL to int64), neither ErrStale nor
// ErrNoRow: no fenced write could ever reach it.
func TestUpdateOnColumnAddedLater(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			for _, stmt := range []string{
				`CREATE TABLE account (id BIGINT PRIMARY KEY, owner TEXT NOT NULL)`,
				`INSERT INTO account (id, owner) VALUES (1, 'ann')`,
				`ALTER TABLE account ADD COLUMN fence_token BIGINT`,
			} {
				if _, err := db.ExecContext(ctx(t), stmt); err != nil {
					t.Fatal(err)
				}
			}
			accounts := guard.Table{Name: "account", Key: "id", Column: "fence_token"}
			if err := accounts.Update(ctx(t), db, 1, 5, "owner = $3", "bob"); err != nil {
				t.Fatalf("first token on a row whose token column is NULL: %v, want it accepted", err)
			}
			var stale *guard.StaleError
			if err := accounts.Update(ctx(t), db, 1, 3, "owner = $3", "late"); !errors.As(err, &stale) || stale.Last != 5 {
				t.Fatalf("token 3 after 5: %v, want a StaleError with last 5", err)
			}
			var owner string
			var token int64
			if err := db.QueryRowContext(ctx(t), `SELECT owner, fence_token FROM account WHERE id = 1`).Scan(&owner, &token); err != nil {
				t.Fatal(err)
			}
			if owner != "bob" || token != 5 {
				t.Fatalf("row = %s, token %d; want bob, 5", owner, token)
			}
		})
	}
}
