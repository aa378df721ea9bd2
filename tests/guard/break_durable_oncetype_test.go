package guard_test

import (
	"errors"
	"testing"

	"github.com/fencekit/fence/guard"
)

// TestOnceKeyColumnOfOwnType: a fence_idempotency made beforehand by a
// schema managed by hand, its key a UUID (the keys an application draws
// are often UUIDs; CreateTables keeps a table that exists). Once's plain
// insert lets PostgreSQL type the key from the column; the durable form
// cast it to text inside a CASE, and PostgreSQL refused every key:
// before the fix Once returned "column "key" is of type uuid but
// expression is of type text (SQLSTATE 42804)", where it had recorded
// the key before the durable form.
func TestOnceKeyColumnOfOwnType(t *testing.T) {
	db := pg.NewDB(t)
	if _, err := db.ExecContext(ctx(t), `CREATE TABLE fence_idempotency (key UUID PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	const key = "6c1f1b4e-8d4e-4b8e-9c61-1b2f3c4d5e6f"
	if err := guard.Once(ctx(t), db, key); err != nil {
		t.Fatalf("Once with a UUID key column: %v, want nil", err)
	}
	if err := guard.Once(ctx(t), db, key); !errors.Is(err, guard.ErrDuplicate) {
		t.Fatalf("Once again with the same key: %v, want ErrDuplicate", err)
	}
}
