package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// The article's conditional update: a write with an older token than the
// row's last one changes nothing and is reported as stale.
func ExampleTable_Update() {
	ctx := context.Background()
	db, _ := sql.Open("sqlite", "file:example?mode=memory")
	defer db.Close()
	_, _ = db.ExecContext(ctx, `CREATE TABLE payment (id INTEGER PRIMARY KEY, status TEXT, last_fencing_token BIGINT NOT NULL DEFAULT 0)`)
	_, _ = db.ExecContext(ctx, `INSERT INTO payment (id, status) VALUES (1001, 'PENDING')`)

	payments := guard.Table{Name: "payment", Key: "id", Column: "last_fencing_token"}
	fmt.Println(payments.Update(ctx, db, 1001, 2, "status = $3", "APPROVED by B"))
	err := payments.Update(ctx, db, 1001, 1, "status = $3", "APPROVED by A")
	fmt.Println(errors.Is(err, guard.ErrStale), err)
	// Output:
	// <nil>
	// true guard: stale token 1 for payment 1001: token 2 already accepted
}

// The fenced read-modify-write: the fence first, then the read, then the
// write, in one transaction. A worker whose token is older than one already
// accepted is rejected before it reads; a newer one waits for an older
// one's transaction and then reads its write. The business table needs no
// token column.
func ExampleTx() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "guard-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", guard.SQLiteDSN(filepath.Join(dir, "payments.db")))
	defer db.Close()
	_ = guard.CreateTables(ctx, db)
	_, _ = db.ExecContext(ctx, `CREATE TABLE payment (id INTEGER PRIMARY KEY, status TEXT, approved_by TEXT)`)
	_, _ = db.ExecContext(ctx, `INSERT INTO payment (id, status) VALUES (1001, 'PENDING')`)

	approve := func(token fence.Token, by string) error {
		return guard.Tx(ctx, db, "payment:1001", token, func(tx *sql.Tx) error {
			var status string
			if err := tx.QueryRowContext(ctx, `SELECT status FROM payment WHERE id = 1001`).Scan(&status); err != nil {
				return err
			}
			if status != "PENDING" {
				return fmt.Errorf("already %s", status)
			}
			_, err := tx.ExecContext(ctx, `UPDATE payment SET status = 'APPROVED', approved_by = $1 WHERE id = 1001`, by)
			return err
		})
	}
	fmt.Println(approve(1, "A"))
	fmt.Println(approve(2, "B"))
	fmt.Println(errors.Is(approve(1, "A again"), guard.ErrStale))
	// Output:
	// <nil>
	// already APPROVED
	// true
}
