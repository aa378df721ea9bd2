package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

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

// A fenced transaction needs no token column in the business table.
func ExampleTx() {
	ctx := context.Background()
	db, _ := sql.Open("sqlite", "file:exampletx?mode=memory")
	defer db.Close()
	_ = guard.CreateTables(ctx, db)
	_, _ = db.ExecContext(ctx, `CREATE TABLE ledger (entry TEXT)`)

	write := func(token int64, entry string) error {
		return guard.Tx(ctx, db, "ledger:acct-7", fence.Token(token), func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO ledger (entry) VALUES ($1)`, entry)
			return err
		})
	}
	fmt.Println(write(2, "B's entry"))
	fmt.Println(errors.Is(write(1, "A's late entry"), guard.ErrStale))
	var n int
	_ = db.QueryRowContext(ctx, `SELECT count(*) FROM ledger`).Scan(&n)
	fmt.Println("entries:", n)
	// Output:
	// <nil>
	// true
	// entries: 1
}
