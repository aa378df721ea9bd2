package guard_test

import (
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/pgtest"
)

// TestFenceSurvivesCrashUnderAsyncCommit: a PostgreSQL server (or role, or
// database) with synchronous_commit = off, a common tuning (the test
// server runs so), acknowledges a commit before its WAL is on disk, and a
// crash within the WAL writer's delay loses it. A fence so lost takes the
// newer holder's token with it: after the recovery the resource's last
// token is the older holder's again, and the older holder, paused past
// its lease, is accepted. Fence on a *sql.DB is the gate before work that
// leaves the database (a remote API): the newer holder did that work when
// its fence was acknowledged, and the older holder then did it again,
// after it. Through Tx (and so SQLStore, Middleware) the newer holder was
// told its fenced transaction committed, and the older holder's write
// then landed after it; so with Table.Update's conditional update, whose
// token is the row's. (FenceCall is the fence with a call id, the upsert
// that Middleware's requests through SQLStore run; with the durable form
// of that upsert alone taken out it fails as the others did.) Before the
// fixes every subtest failed: the stale
// token 5 was accepted after token 7's was acknowledged (the last token
// read after the recovery: 3).
//
// The crash is made deterministic as in tests/pglock's
// TestGrantSurvivesCrashUnderAsyncCommit: the WAL writer is stopped
// (SIGSTOP) before the newer holder's fence and killed (SIGKILL) after its
// reply, so that the postmaster ends every backend and recovers from the
// WAL on disk. The schema and the older token are made durable first
// (CHECKPOINT).
func TestFenceSurvivesCrashUnderAsyncCommit(t *testing.T) {
	for _, how := range []string{"Fence", "FenceCall", "Tx", "Update"} {
		t.Run(how, func(t *testing.T) {
			db, dsn := asyncCommitDB(t)
			setup(t, db)
			fenced := func(db *sql.DB, token fence.Token) error {
				switch how {
				case "Fence":
					return guard.Fence(ctx(t), db, "payment:1001", token)
				case "FenceCall":
					// With a call id (Middleware's requests through
					// SQLStore): the upsert that records it too.
					return guard.Fence(guard.WithCall(ctx(t), fmt.Sprint("call-", token)), db, "payment:1001", token)
				case "Update":
					return payments.Update(ctx(t), db, 1001, token, "approved_by = $3", fmt.Sprint(token))
				}
				return guard.Tx(ctx(t), db, "payment:1001", token, func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx(t), `UPDATE payment SET status = 'APPROVED', approved_by = $1 WHERE id = 1001`, fmt.Sprint(token))
					return err
				})
			}
			query := `SELECT token FROM fence_tokens WHERE resource = 'payment:1001'`
			if how == "Update" {
				query = `SELECT last_fencing_token FROM payment WHERE id = 1001`
			}
			wantStaleAfterCrash(t, db, dsn, "fence", fenced, func(after *sql.DB) int64 {
				var last int64
				if err := after.QueryRowContext(ctx(t), query).Scan(&last); err != nil {
					t.Fatal(err)
				}
				return last
			})
		})
	}
}

// wantStaleAfterCrash has fenced take token 3 on db, then token 7 with
// db's server crashing after its reply (pgtest.CrashAfter), and fails the
// test unless, after the recovery, fenced refuses the older holder's
// token 5 as stale. what names fenced in the messages; last reads the
// last token after the recovery, for them.
func wantStaleAfterCrash(t *testing.T, db *sql.DB, dsn, what string, fenced func(*sql.DB, fence.Token) error, last func(*sql.DB) int64) {
	t.Helper()
	if err := fenced(db, 3); err != nil {
		t.Fatal(err)
	}
	pgtest.CrashAfter(t, db, dsn, func() {
		if err := fenced(db, 7); err != nil {
			t.Fatalf("the newer holder's %s: %v", what, err)
		}
	})
	after := openPG(t, dsn)
	lastAfter := last(after)
	err := fenced(after, 5)
	if err == nil {
		t.Fatalf("after a crash, the older holder's token 5 was accepted, though token 7's %s was acknowledged before it (last token after the recovery: %d)", what, lastAfter)
	}
	if !errors.Is(err, guard.ErrStale) {
		t.Fatalf("the older holder's %s after the crash: %v, want ErrStale", what, err)
	}
}

// TestOnceKeySurvivesCrashUnderAsyncCommit: Once's idempotency key,
// recorded under synchronous_commit = off, acknowledged and lost in a
// crash, let the same key be recorded again: the work it guards (a remote
// call made once Once returned nil) was done twice. Before the fix the
// second Once returned nil, not ErrDuplicate.
func TestOnceKeySurvivesCrashUnderAsyncCommit(t *testing.T) {
	db, dsn := asyncCommitDB(t)
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	pgtest.CrashAfter(t, db, dsn, func() {
		if err := guard.Once(ctx(t), db, "approve:1001"); err != nil {
			t.Fatalf("the first Once: %v", err)
		}
	})
	err := guard.Once(ctx(t), openPG(t, dsn), "approve:1001")
	if err == nil {
		t.Fatal("after a crash, the key approve:1001 was recorded again, though its first Once was acknowledged: the work was done twice")
	}
	if !errors.Is(err, guard.ErrDuplicate) {
		t.Fatalf("Once after the crash: %v, want ErrDuplicate", err)
	}
}

// asyncCommitDB returns a database, and its DSN, on a PostgreSQL server of
// the test's own (pgtest.CrashAfter crashes it) that runs with synchronous_commit
// off.
func asyncCommitDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	srv, err := pgtest.Launch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill)
	name, err := srv.CreateDatabase(ctx(t), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	db := openPG(t, srv.DSN(name))
	var setting string
	if err := db.QueryRowContext(ctx(t), `SHOW synchronous_commit`).Scan(&setting); err != nil {
		t.Fatal(err)
	}
	if setting != "off" {
		t.Fatalf("the test server's synchronous_commit is %q, want off", setting)
	}
	return db, srv.DSN(name)
}

func openPG(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
