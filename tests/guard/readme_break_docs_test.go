package guard_test

import (
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// TestREADMEGuardSnippet runs the README's guard snippet, as it stands, on
// SQLite (the file DSN it shows) and checks each error its comments name:
// an older token's Tx and Update fail with ErrStale, a missing row is
// ErrNoRow, a set clause with a comment is ErrInvalidTable, a second Once
// is ErrDuplicate, and an UpdateVersion from an old version is ErrConflict.
func TestREADMEGuardSnippet(t *testing.T) {
	ctx := ctx(t)
	const schema = `CREATE TABLE IF NOT EXISTS payment (id INTEGER PRIMARY KEY, status TEXT NOT NULL,
		last_fencing_token BIGINT, version BIGINT NOT NULL DEFAULT 0)`
	older, newer := fence.Token(100), fence.Token(200)

	// The snippet's statements, in order.
	db, err := sql.Open("sqlite", guard.SQLiteDSN(filepath.Join(t.TempDir(), "payments.db"))) // WAL, busy timeout, BEGIN IMMEDIATE; or PostgreSQL
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = guard.CreateIfNotExists(ctx, db, schema)
	if err != nil {
		t.Fatal(err)
	}
	err = guard.CreateTables(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO payment (id, status) VALUES (1001, 'PENDING')`); err != nil {
		t.Fatal(err)
	}
	var read string
	err = guard.Tx(ctx, db, "payment:1001", newer, func(tx *sql.Tx) error {
		// read through tx, decide, write through tx
		return tx.QueryRowContext(ctx, `SELECT status FROM payment WHERE id = 1001`).Scan(&read)
	})
	if err != nil || read != "PENDING" {
		t.Fatalf("Tx with a fresh token: %v (read %q)", err, read)
	}
	err = guard.Tx(ctx, db, "payment:1001", older, func(tx *sql.Tx) error { return nil })
	if !errors.Is(err, guard.ErrStale) {
		t.Errorf("Tx with an older token = %v, want ErrStale", err)
	}

	payments := guard.Table{Name: "payment", Key: "id", Column: "last_fencing_token"}
	err = payments.Update(ctx, db, 1001, newer, "status = $3", "APPROVED")
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if err = payments.Update(ctx, db, 1001, older, "status = $3", "APPROVED"); !errors.Is(err, guard.ErrStale) {
		t.Errorf("Update with an older token = %v, want ErrStale", err)
	}
	if err = payments.Update(ctx, db, 4242, newer, "status = $3", "APPROVED"); !errors.Is(err, guard.ErrNoRow) {
		t.Errorf("Update of a missing row = %v, want ErrNoRow", err)
	}
	for _, set := range []string{"status = $3 -- x", "status = $3 /* x */", "status = $3; DELETE FROM payment"} {
		if err = payments.Update(ctx, db, 1001, newer+1, set, "APPROVED"); !errors.Is(err, guard.ErrInvalidTable) {
			t.Errorf("Update with set %q = %v, want ErrInvalidTable", set, err)
		}
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = guard.Once(ctx, tx, "approve:1001") // guard.ErrDuplicate
	if err != nil {
		t.Fatalf("first Once: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err = guard.Once(ctx, db, "approve:1001"); !errors.Is(err, guard.ErrDuplicate) {
		t.Errorf("second Once = %v, want ErrDuplicate", err)
	}
	var v int64
	err = guard.Table{Name: "payment", Key: "id", Column: "version"}.UpdateVersion(ctx, db, 1001, v, "status = $3", "REVIEW") // guard.ErrConflict
	if err != nil {
		t.Fatalf("UpdateVersion from the current version: %v", err)
	}
	err = guard.Table{Name: "payment", Key: "id", Column: "version"}.UpdateVersion(ctx, db, 1001, v, "status = $3", "REVIEW")
	if !errors.Is(err, guard.ErrConflict) {
		t.Errorf("UpdateVersion from an old version = %v, want ErrConflict", err)
	}
}
