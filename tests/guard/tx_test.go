package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// approveTx is a fenced read-modify-write on payment 1001: read the status
// inside the transaction, write if it is pending.
func approveTx(ctx context.Context, db *sql.DB, token fence.Token, by string) error {
	return guard.Tx(ctx, db, "payment:1001", token, func(tx *sql.Tx) error {
		var status string
		if err := tx.QueryRowContext(ctx, `SELECT status FROM payment WHERE id = 1001`).Scan(&status); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE payment SET approved_by = $1 WHERE id = 1001`, by)
		return err
	})
}

// TestTxPanicRollsBack (issue 10, hole 6): fn panics while the fence's row
// lock is held. Tx must roll back and re-panic; the next Tx on the resource
// must not wait for the abandoned transaction. Before the fix it waited on
// PostgreSQL until its deadline.
func TestTxPanicRollsBack(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			got := func() (p any) {
				defer func() { p = recover() }()
				_ = guard.Tx(ctx(t), db, "payment:1001", 5, func(tx *sql.Tx) error {
					if _, err := tx.ExecContext(ctx(t), `UPDATE payment SET approved_by = 'panicked' WHERE id = 1001`); err != nil {
						return err
					}
					panic("boom")
				})
				return nil
			}()
			if got != "boom" {
				t.Fatalf("recovered %v, want the panic to go on", got)
			}
			next, cancel := context.WithTimeout(ctx(t), 10*time.Second)
			defer cancel()
			if err := approveTx(next, db, 6, "w6"); err != nil {
				t.Fatalf("the next Tx after a panic: %v", err)
			}
			if _, by, _ := row(t, db); by.String != "w6" {
				t.Fatalf("approved_by = %q, want w6 (the panicked write rolled back)", by.String)
			}
		})
	}
}

// TestTxCareless: what a careless caller does. A token equal to the last is
// stale; a ctx cancelled in the middle of fn rolls everything back, token
// included; a stale Tx never calls fn.
func TestTxCareless(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			if err := approveTx(ctx(t), db, 7, "w7"); err != nil {
				t.Fatal(err)
			}
			called := false
			err := guard.Tx(ctx(t), db, "payment:1001", 7, func(*sql.Tx) error { called = true; return nil })
			if !errors.Is(err, guard.ErrStale) || called {
				t.Fatalf("token equal to the last: %v (fn called: %v), want ErrStale and fn not called", err, called)
			}
			c, cancel := context.WithCancel(ctx(t))
			err = guard.Tx(c, db, "payment:1001", 8, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(c, `UPDATE payment SET approved_by = 'cancelled' WHERE id = 1001`); err != nil {
					return err
				}
				cancel()
				return nil
			})
			if !errors.Is(err, context.Canceled) && !errors.Is(err, sql.ErrTxDone) {
				t.Fatalf("ctx cancelled inside fn: %v, want an error", err)
			}
			if _, by, _ := row(t, db); by.String != "w7" {
				t.Fatalf("approved_by = %q after a cancelled Tx, want w7", by.String)
			}
			if err := approveTx(ctx(t), db, 8, "w8"); err != nil {
				t.Fatalf("token 8 after its cancelled Tx: %v (the token must have rolled back too)", err)
			}
		})
	}
}

// TestSQLiteDSNConcurrent (issue 10, hole 7): 16 goroutines × 20 fenced
// transactions on one SQLite file opened with guard.SQLiteDSN. Each ends in
// success or ErrStale; none in SQLITE_BUSY. Before, 307 of 320 failed with
// SQLITE_BUSY.
func TestSQLiteDSNConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "busy?#%.db") // characters a file: URI treats specially
	db, err := sql.Open("sqlite", guard.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	setup(t, db)
	const workers, rounds = 16, 20
	var ok, stale atomic.Int64
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			for r := range rounds {
				token := fence.Token(1 + g + r*workers)
				switch err := approveTx(ctx(t), db, token, fmt.Sprint(token)); {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, guard.ErrStale):
					stale.Add(1)
				default:
					t.Errorf("token %d: %v", token, err)
				}
			}
		})
	}
	wg.Wait()
	if ok.Load() == 0 {
		t.Fatal("no transaction succeeded")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the database is not at the path given: %v", err)
	}
	t.Logf("%d committed, %d stale", ok.Load(), stale.Load())
}

// TestSQLiteBusyIsRetry: without a busy timeout SQLite fails conflicting
// transactions at once; those failures must at least come back as ErrRetry.
func TestSQLiteBusyIsRetry(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "nobusy.db")+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	setup(t, db)
	// One transaction holds the write lock while another tries to fence.
	hold, err := db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if err := guard.Fence(ctx(t), hold, "payment:1001", 1); err != nil {
		t.Fatal(err)
	}
	err = approveTx(ctx(t), db, 2, "w2")
	if !errors.Is(err, guard.ErrRetry) {
		t.Fatalf("a fence blocked by another writer without a busy timeout: %v, want ErrRetry", err)
	}
}

// TestTxIsolationLevels (issue 10, hole 9): 400 concurrent fenced writes on
// a PostgreSQL database whose default isolation is REPEATABLE READ or
// SERIALIZABLE. Every result is nil, ErrStale or ErrRetry; before, 219 of
// 400 were raw serialization failures.
func TestTxIsolationLevels(t *testing.T) {
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			db := isolatedDB(t, level)
			db.SetMaxOpenConns(20)
			const writes = 400
			var out outcomes
			var wg sync.WaitGroup
			for i := range writes {
				wg.Go(func() {
					token := fence.Token(1 + (i*7919)%writes) // tokens in a scrambled order
					out.count(t, int64(token), approveTx(ctx(t), db, token, fmt.Sprint(token)))
				})
			}
			wg.Wait()
			if out.ok.Load() == 0 {
				t.Fatal("no write succeeded")
			}
			t.Logf("%d committed, %d stale, %d retry", out.ok.Load(), out.stale.Load(), out.retry.Load())
		})
	}
}

// TestTxMisuse: fn that works around tx. Committing tx inside fn makes Tx
// fail with sql.ErrTxDone (on PostgreSQL the work is committed: do not; on
// SQLite Tx's commit hook refuses that commit, and nothing is); reading through
// db inside fn with a pool of one connection waits for the pool until ctx
// ends, and then Tx fails instead of hanging for ever.
func TestTxMisuse(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			err := guard.Tx(ctx(t), db, "payment:1001", 3, func(tx *sql.Tx) error { return tx.Commit() })
			switch name {
			case "sqlite":
				var n int
				if qerr := db.QueryRowContext(ctx(t), `SELECT count(*) FROM fence_tokens`).Scan(&n); err == nil || qerr != nil || n != 0 {
					t.Fatalf("fn committed tx itself: %v, %d token(s) recorded (%v), want the commit refused, nothing recorded", err, n, qerr)
				}
			default:
				if !errors.Is(err, sql.ErrTxDone) {
					t.Fatalf("fn committed tx itself: %v, want sql.ErrTxDone", err)
				}
			}
			db.SetMaxOpenConns(1)
			short, cancel := context.WithTimeout(ctx(t), 500*time.Millisecond)
			defer cancel()
			err = guard.Tx(short, db, "payment:1001", 4, func(tx *sql.Tx) error {
				var status string
				return db.QueryRowContext(short, `SELECT status FROM payment WHERE id = 1001`).Scan(&status)
			})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("fn read through db on a pool of one: %v, want the deadline", err)
			}
			if err := approveTx(ctx(t), db, 5, "w5"); err != nil {
				t.Fatalf("the next Tx: %v", err)
			}
		})
	}
}

// outcomes counts fenced transactions by their result: committed, refused
// as stale, or to retry; any other error fails the test.
type outcomes struct{ ok, stale, retry atomic.Int64 }

func (o *outcomes) count(t *testing.T, token int64, err error) {
	switch {
	case err == nil:
		o.ok.Add(1)
	case errors.Is(err, guard.ErrStale):
		o.stale.Add(1)
	case errors.Is(err, guard.ErrRetry):
		o.retry.Add(1)
	default:
		t.Errorf("token %d: %v", token, err)
	}
}

// acceptedLog reads the accepted table's tokens in their order of
// acceptance, failing the test if one is not greater than the one before.
func acceptedLog(t *testing.T, db *sql.DB) map[int64]bool {
	t.Helper()
	rows, err := db.QueryContext(ctx(t), `SELECT token FROM accepted ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	logged := map[int64]bool{}
	var last int64
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			t.Fatal(err)
		}
		if tok <= last {
			t.Errorf("token %d accepted after %d", tok, last)
		}
		last = tok
		logged[tok] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return logged
}
