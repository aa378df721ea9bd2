package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/stopped"
)

// The guard's SQL side tried again as an attacker and as a careless user
// (branch break-guard).

// isolatedDB is a fresh PostgreSQL database, set up, whose transactions
// run at level (e.g. "repeatable read") by default.
func isolatedDB(t *testing.T, level string) *sql.DB {
	t.Helper()
	db := pg.NewDB(t)
	setup(t, db)
	var name string
	if err := db.QueryRowContext(ctx(t), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx(t), fmt.Sprintf(`ALTER DATABASE %s SET default_transaction_isolation = '%s'`, name, level)); err != nil {
		t.Fatal(err)
	}
	db.SetMaxIdleConns(0) // drop the connection opened before the ALTER
	db.SetMaxIdleConns(4)
	var got string
	if err := db.QueryRowContext(ctx(t), `SHOW transaction_isolation`).Scan(&got); err != nil || got != level {
		t.Fatalf("isolation %q (%v), want %q", got, err, level)
	}
	return db
}

// waitLockWaiters waits until n sessions of db's database wait for a lock
// (pg_stat_activity), or fails the test after 10 s.
func waitLockWaiters(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var got int
		err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions wait for a lock after 10 s, want %d", got, n)
		}
		<-tick.C
	}
}

// TestSQLHelpersSerializationFailureIsRetry: on a PostgreSQL database whose
// default isolation is REPEATABLE READ, Table.Update, Table.UpdateVersion
// and Once, run on their own (q a *sql.DB), wait for a concurrent
// transaction that writes the same row and commits; PostgreSQL then
// aborts them with a serialization failure (40001). Nothing was written:
// that is ErrRetry, as Fence and Tx report it, not an unclassified error a
// caller cannot tell from a broken database.
func TestSQLHelpersSerializationFailureIsRetry(t *testing.T) {
	versions := guard.Table{Name: "payment", Key: "id", Column: "version"}
	for _, tc := range []struct {
		name  string
		other func(tx *sql.Tx) error // the concurrent transaction's write
		call  func(db *sql.DB) error
	}{
		{"Update",
			func(tx *sql.Tx) error {
				return payments.Update(ctx(t), tx, 1001, 9, "approved_by = $3", "w9")
			},
			func(db *sql.DB) error {
				return payments.Update(ctx(t), db, 1001, 10, "approved_by = $3", "w10")
			}},
		{"UpdateVersion",
			func(tx *sql.Tx) error {
				return versions.UpdateVersion(ctx(t), tx, 1001, 0, "approved_by = $3", "v0")
			},
			func(db *sql.DB) error {
				return versions.UpdateVersion(ctx(t), db, 1001, 0, "approved_by = $3", "v0 again")
			}},
		{"Once",
			func(tx *sql.Tx) error { return guard.Once(ctx(t), tx, "approve:1001") },
			func(db *sql.DB) error { return guard.Once(ctx(t), db, "approve:1001") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := isolatedDB(t, "repeatable read")
			tx, err := db.BeginTx(ctx(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if err := tc.other(tx); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- tc.call(db) }()
			waitLockWaiters(t, db, 1)
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			err = <-done
			if !errors.Is(err, guard.ErrRetry) {
				t.Fatalf("%s after a concurrent write at REPEATABLE READ: %v; want ErrRetry", tc.name, err)
			}
		})
	}
}

// TestTxHungPostgresEveryStep stops (SIGSTOP) the PostgreSQL backend of a
// one-connection pool at each step of a fenced transaction that
// TestTxHungPostgresWithinDeadline does not reach: before BEGIN, before the
// fence's upsert, and before the COMMIT; each with a context that ends
// (deadline, and cancellation without a deadline) after 200 ms. Tx and
// Fence must return by then with the context's error, never hang.
func TestTxHungPostgresEveryStep(t *testing.T) {
	const wait = 200 * time.Millisecond
	const slack = 800 * time.Millisecond
	stop := func(t *testing.T, proc *os.Process) {
		if err := proc.Signal(syscall.SIGSTOP); err != nil {
			t.Error(err)
		}
		stopped.Wait(proc.Pid, stopped.Limit)
	}
	steps := map[string]func(t *testing.T, c context.Context, db *sql.DB, proc *os.Process) error{
		"begin": func(t *testing.T, c context.Context, db *sql.DB, proc *os.Process) error {
			stop(t, proc)
			return guard.Tx(c, db, "payment:1001", 5, func(*sql.Tx) error { return nil })
		},
		"fence": func(t *testing.T, c context.Context, db *sql.DB, proc *os.Process) error {
			tx, err := db.BeginTx(c, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			stop(t, proc)
			return guard.Fence(c, tx, "payment:1001", 5)
		},
		"commit": func(t *testing.T, c context.Context, db *sql.DB, proc *os.Process) error {
			return guard.Tx(c, db, "payment:1001", 5, func(tx *sql.Tx) error {
				stop(t, proc)
				return nil
			})
		},
	}
	for name, step := range steps {
		for _, end := range []string{"deadline", "cancel"} {
			t.Run(name+"/"+end, func(t *testing.T) {
				db, proc, resume := oneBackend(t)
				defer resume()
				var c context.Context
				var cancel context.CancelFunc
				want := context.DeadlineExceeded
				if end == "deadline" {
					c, cancel = context.WithTimeout(context.Background(), wait)
				} else {
					c, cancel = context.WithCancel(context.Background())
					time.AfterFunc(wait, cancel)
					want = context.Canceled
				}
				defer cancel()
				start := time.Now()
				done := make(chan error, 1)
				go func() { done <- step(t, c, db, proc) }()
				timer := time.NewTimer(wait + slack)
				defer timer.Stop()
				select {
				case err := <-done:
					if took := time.Since(start); took > wait+slack || !errors.Is(err, want) {
						t.Errorf("hung backend at %s: %v after %v; want %v within %v", name, err, took, want, wait+slack)
					}
				case <-timer.C:
					t.Errorf("hung backend at %s: still running after %v (context ended after %v)", name, wait+slack, wait)
					resume()
					<-done
				}
			})
		}
	}
}
