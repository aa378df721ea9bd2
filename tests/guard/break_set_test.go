package guard_test

import (
	"errors"
	"testing"

	"github.com/fencekit/fence/guard"
)

// TestUpdateSetCannotCutOffTheFence: Table.Update and UpdateVersion append
// their WHERE clause (the key, and the token or version compared) after
// the caller's set. A set that ends in a comment (a careless
// "status = $3 -- approve", or an unclosed "/*") or holds a ';' makes the
// comment swallow that WHERE clause, or the statement end before it. On
// PostgreSQL the statement then fails (its placeholders $1 and $2 are
// gone); on SQLite, which ignores arguments a statement does not use, it
// ran as "UPDATE payment SET status = $3": every row of the table
// approved, none fenced, and Update reported the token accepted. Update
// must refuse such a set, on both databases, and write nothing.
func TestUpdateSetCannotCutOffTheFence(t *testing.T) {
	versions := guard.Table{Name: "payment", Key: "id", Column: "version"}
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			// A second payment, fenced by a newer holder already: no
			// update of 1001 may touch it, and no token 5 may write it.
			if _, err := db.ExecContext(ctx(t), `INSERT INTO payment (id, status, last_fencing_token) VALUES (2002, 'PENDING', 100)`); err != nil {
				t.Fatal(err)
			}
			for _, set := range []string{
				"status = $3 -- approve",
				"status = $3 /* approve",
				"status = $3 /* approve */ --",
				"status = $3; UPDATE payment SET approved_by = 'x'",
			} {
				err := payments.Update(ctx(t), db, 1001, 5, set, "APPROVED")
				if err == nil {
					t.Errorf("Update(set %q) = nil; want an error (the set would cut off the fence)", set)
				}
				err = versions.UpdateVersion(ctx(t), db, 1001, 0, set, "APPROVED")
				if err == nil || errors.Is(err, guard.ErrConflict) {
					t.Errorf("UpdateVersion(set %q) = %v; want an error (the set would cut off the version check)", set, err)
				}
			}
			rows, err := db.QueryContext(ctx(t), `SELECT id, status, last_fencing_token, version FROM payment ORDER BY id`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			for rows.Next() {
				var id, token, version int64
				var status string
				if err := rows.Scan(&id, &status, &token, &version); err != nil {
					t.Fatal(err)
				}
				if status != "PENDING" {
					t.Errorf("payment %d: status %s (token %d, version %d); want PENDING: an unfenced update ran", id, status, token, version)
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			// A set that merely holds the characters inside a placeholder's
			// value is fine: values go through arguments.
			if err := payments.Update(ctx(t), db, 1001, 5, "status = $3, approved_by = $4", "APPROVED", "a -- b; /* c */"); err != nil {
				t.Fatalf("Update with -- in an argument: %v", err)
			}
		})
	}
}
