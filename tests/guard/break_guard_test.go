package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/stopped"
	"github.com/redis/go-redis/v9"
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

// TestMiddlewareStressWithCancels: 8 clients send 320 fenced requests,
// with tokens from one counter (so they race each other), to Middleware over SQLStore, and cancel
// a quarter of them at a random moment (before the store, in the handler,
// around the commit). The handler logs its token in the fenced
// transaction. The log, in commit order, must strictly increase (no stale
// token accepted after a newer one); every 200 must be in the log (no
// success reported for a write that did not happen) and no 409 may be
// (no stale reported for a write that happened).
func TestMiddlewareStressWithCancels(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			mw := guard.Middleware(guard.SQLStore{DB: db}, guard.HTTPOptions{Resource: oneResource, MaxAhead: -1,
				Logger: slog.New(slog.DiscardHandler)})
			srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tx, _ := guard.TxFrom(r.Context())
				token, _ := guard.ParseToken(r.Header.Get(guard.TokenHeader))
				if _, err := tx.ExecContext(r.Context(),
					`INSERT INTO accepted (seq, token) SELECT COALESCE(MAX(seq), 0) + 1, $1 FROM accepted`, int64(token)); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
				}
			})))
			defer srv.Close()
			const clients, each = 8, 40
			type outcome struct {
				token int64
				code  int // 0: the client gave up (cancelled)
			}
			results := make(chan outcome, clients*each)
			var next atomic.Int64 // tokens roughly in order, racing between clients
			var wg sync.WaitGroup
			for c := range clients {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(c), 42))
					for range each {
						token := next.Add(1)
						rctx, cancel := context.WithCancel(ctx(t))
						if rng.IntN(4) == 0 {
							time.AfterFunc(time.Duration(rng.IntN(3000))*time.Microsecond, cancel)
						}
						req, _ := http.NewRequestWithContext(rctx, http.MethodPost, srv.URL, nil)
						req.Header.Set(guard.TokenHeader, strconv.FormatInt(token, 10))
						resp, err := srv.Client().Do(req)
						code := 0
						if err == nil {
							_, _ = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							code = resp.StatusCode
						}
						cancel()
						results <- outcome{token, code}
					}
				})
			}
			wg.Wait()
			close(results)
			logged := acceptedLog(t, db)
			counts := map[int]int{}
			for o := range results {
				counts[o.code]++
				switch {
				case o.code == http.StatusOK && !logged[o.token]:
					t.Errorf("token %d answered 200 but its write is not in the log", o.token)
				case o.code == http.StatusConflict && logged[o.token]:
					t.Errorf("token %d answered 409 but its write is in the log", o.token)
				case o.code != 0 && o.code != http.StatusOK && o.code != http.StatusConflict && o.code != http.StatusServiceUnavailable && o.code != http.StatusBadRequest:
					t.Errorf("token %d answered %d", o.token, o.code)
				}
			}
			if counts[http.StatusOK] == 0 || counts[http.StatusConflict] == 0 {
				t.Fatalf("answers %v: the test did not exercise the guard", counts)
			}
			t.Logf("answers %v (0: cancelled), %d logged", counts, len(logged))
		})
	}
}

// insertAfterExec is a Querier that, once its first statement that ran
// (the conditional update) has run, runs insert on the database: a row
// that another session inserts between Table.Update's UPDATE and the read
// that tells why nothing changed. (On SQLite, Update's first statement,
// PostgreSQL's durable form, is refused before it runs.)
type insertAfterExec struct {
	*sql.DB
	insert string
	done   bool
}

func (q *insertAfterExec) ExecContext(c context.Context, query string, args ...any) (sql.Result, error) {
	res, err := q.DB.ExecContext(c, query, args...)
	if !q.done && err == nil {
		q.done = true
		if _, ierr := q.DB.ExecContext(c, q.insert); ierr != nil {
			return nil, ierr
		}
	}
	return res, err
}

// TestUpdateOnRowInsertedMeanwhile: Table.Update finds no row, and another
// session inserts it (unfenced: token 0, or NULL) before Update reads the
// row to tell why. Update must not answer with a StaleError whose last
// accepted token is below the caller's ("stale token 5: token 0 already
// accepted"): no newer token was accepted, and a caller that gives up on
// ErrStale would drop the newest holder's write. UpdateVersion, likewise,
// must not report a conflict with the very version the caller expected.
func TestUpdateOnRowInsertedMeanwhile(t *testing.T) {
	versions := guard.Table{Name: "payment", Key: "id", Column: "version"}
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			if _, err := db.ExecContext(ctx(t), `CREATE TABLE legacy (id BIGINT PRIMARY KEY, status TEXT, tok BIGINT)`); err != nil {
				t.Fatal(err)
			}
			legacy := guard.Table{Name: "legacy", Key: "id", Column: "tok"}
			for _, tc := range []struct {
				name   string
				insert string
				call   func(q guard.Querier) error
			}{
				{"Update, token 0", `INSERT INTO payment (id, status) VALUES (2001, 'PENDING')`,
					func(q guard.Querier) error {
						return payments.Update(ctx(t), q, 2001, 5, "status = $3", "APPROVED")
					}},
				{"Update, NULL token", `INSERT INTO legacy (id, status) VALUES (2002, 'PENDING')`,
					func(q guard.Querier) error {
						return legacy.Update(ctx(t), q, 2002, 5, "status = $3", "APPROVED")
					}},
				{"UpdateVersion", `INSERT INTO payment (id, status) VALUES (2003, 'PENDING')`,
					func(q guard.Querier) error {
						return versions.UpdateVersion(ctx(t), q, 2003, 0, "status = $3", "APPROVED")
					}},
			} {
				err := tc.call(&insertAfterExec{DB: db, insert: tc.insert})
				var stale *guard.StaleError
				var conflict *guard.ConflictError
				switch {
				case errors.As(err, &stale) && stale.Last < stale.Token:
					t.Errorf("%s: %v; a StaleError whose last token is below the caller's", tc.name, err)
				case errors.As(err, &conflict) && conflict.Current == conflict.Expected:
					t.Errorf("%s: %v; a conflict with the version expected", tc.name, err)
				case !errors.Is(err, guard.ErrNoRow):
					t.Errorf("%s: %v; want ErrNoRow (there was no row when the update ran)", tc.name, err)
				}
			}
		})
	}
}

// TestLockTimeoutIsRetry: a PostgreSQL database with lock_timeout set (as
// one bounds lock waits) gives up on a fenced transaction that waits for a
// concurrent one's fence row longer than that, with lock_not_available
// (55P03). Nothing was written: that is ErrRetry, as SQLite's SQLITE_BUSY
// after its busy timeout is.
func TestLockTimeoutIsRetry(t *testing.T) {
	db := pg.NewDB(t)
	setup(t, db)
	var name string
	if err := db.QueryRowContext(ctx(t), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx(t), `ALTER DATABASE `+name+` SET lock_timeout = '100ms'`); err != nil {
		t.Fatal(err)
	}
	db.SetMaxIdleConns(0) // drop the connection opened before the ALTER
	db.SetMaxIdleConns(2)
	hold, err := db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if err := guard.Fence(ctx(t), hold, "payment:1001", 5); err != nil {
		t.Fatal(err)
	}
	err = approveTx(ctx(t), db, 7, "w7")
	if !errors.Is(err, guard.ErrRetry) {
		t.Fatalf("a fence that waited past lock_timeout: %v, want ErrRetry", err)
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := approveTx(ctx(t), db, 7, "w7"); err != nil {
		t.Fatalf("token 7 once the other transaction ended: %v (the timed-out attempt must have recorded nothing)", err)
	}
}

// TestFenceAfterReadChargesTwice: a careless caller of Fence in a
// transaction of its own reads the payment first and fences after. On
// PostgreSQL at READ COMMITTED, B (token 7) reads PENDING while A (token
// 5), fenced already, has not committed; B's fence waits for A's row lock,
// A approves and commits, B's fence then succeeds (5 < 7) and B approves on
// its stale read: two charges. With the fence first (as Tx does), B reads
// after A's commit and charges nothing. Fence's doc says to fence first;
// this test shows why, and fails if the hazard goes away (then update the
// doc).
func TestFenceAfterReadChargesTwice(t *testing.T) {
	for _, fenceFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("fence first %v", fenceFirst), func(t *testing.T) {
			db := pg.NewDB(t)
			setup(t, db)
			if _, err := db.ExecContext(ctx(t), `CREATE TABLE charge (token BIGINT NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			// approve is one holder's transaction; between is called after
			// its fence and read, before its write.
			approve := func(token int64, between func()) error {
				tx, err := db.BeginTx(ctx(t), nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				var status string
				read := func() error {
					return tx.QueryRowContext(ctx(t), `SELECT status FROM payment WHERE id = 1001`).Scan(&status)
				}
				steps := []func() error{read, func() error { return guard.Fence(ctx(t), tx, "payment:1001", fence.Token(token)) }}
				if fenceFirst {
					steps[0], steps[1] = steps[1], steps[0]
				}
				for _, step := range steps {
					if err := step(); err != nil {
						return err
					}
				}
				between()
				if status != "PENDING" {
					return nil // already approved: nothing to charge
				}
				if _, err := tx.ExecContext(ctx(t), `UPDATE payment SET status = 'APPROVED' WHERE id = 1001`); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx(t), `INSERT INTO charge (token) VALUES ($1)`, token); err != nil {
					return err
				}
				return tx.Commit()
			}
			aFenced, bWaits := make(chan struct{}), make(chan struct{})
			aErr := make(chan error, 1)
			go func() { aErr <- approve(5, func() { close(aFenced); <-bWaits }) }()
			<-aFenced
			bErr := make(chan error, 1)
			go func() { bErr <- approve(7, func() {}) }()
			waitLockWaiters(t, db, 1) // B waits for A's fence row (after its read, or before it)
			close(bWaits)
			if err := <-aErr; err != nil {
				t.Fatalf("A: %v", err)
			}
			if err := <-bErr; err != nil {
				t.Fatalf("B: %v", err)
			}
			var charges int
			if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM charge`).Scan(&charges); err != nil {
				t.Fatal(err)
			}
			switch {
			case fenceFirst && charges != 1:
				t.Fatalf("fence first: %d charges, want 1", charges)
			case !fenceFirst && charges != 2:
				t.Fatalf("read before the fence: %d charges; the hazard Fence's doc warns of is gone, update the doc", charges)
			}
		})
	}
}

// TestTxRawRollbackInFn: fn ends the transaction with SQL of its own
// (ROLLBACK, as a script run through tx might) and then writes. The fence
// is rolled back with everything before it, and fn's later write runs on
// its own, outside any transaction, unfenced. Tx must not report success.
func TestTxRawRollbackInFn(t *testing.T) {
	t.Skip("bug: on PostgreSQL, fn that runs ROLLBACK (or COMMIT) as SQL through tx makes Tx report success with the fence rolled back (or committed early) and fn's later writes made unfenced; COMMIT of a session with no transaction is only a warning. No small fix: telling that the transaction is still open before the commit takes a dialect-specific query (pg_current_xact_id_if_assigned) and a round trip per Tx, and the unfenced writes are made before it; Tx's doc forbids it")
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			err := guard.Tx(ctx(t), db, "payment:1001", 5, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx(t), `ROLLBACK`); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx(t), `UPDATE payment SET approved_by = 'w5' WHERE id = 1001`)
				return err
			})
			var last sql.NullInt64
			if qerr := db.QueryRowContext(ctx(t), `SELECT max(token) FROM fence_tokens WHERE resource = 'payment:1001'`).Scan(&last); qerr != nil {
				t.Fatal(qerr)
			}
			_, by, _ := row(t, db)
			t.Logf("Tx: %v; last token %v, approved_by %q", err, last, by.String)
			if err == nil && last.Int64 != 5 {
				t.Fatalf("Tx reported success, but token 5 is not recorded (last %v) and approved_by is %q, written unfenced", last, by.String)
			}
		})
	}
}

// TestCreateTablesConcurrently: several processes of one service start at
// once and each calls CreateTables on a fresh PostgreSQL database, as
// CreateSchema in the payment example does. CREATE TABLE IF NOT EXISTS is
// not safe against a concurrent one in PostgreSQL (the loser may fail on
// pg_type's unique index, 23505, instead of finding the table): every
// call must succeed.
func TestCreateTablesConcurrently(t *testing.T) {
	for round := range 5 {
		db := pg.NewDB(t)
		db.SetMaxOpenConns(8)
		for _, err := range atOnce(8, func(_ int, start <-chan struct{}) error {
			<-start
			return guard.CreateTables(ctx(t), db)
		}) {
			if err != nil {
				t.Errorf("round %d: CreateTables at once with 7 others: %v", round, err)
			}
		}
	}
}

// TestCreateIfNotExistsConcurrently: CreateIfNotExists with a service's own
// schema, several statements in one string (PostgreSQL runs them as one
// transaction) and a table with an identity column (its sequence is one
// more object to race on), run by 8 processes at once on a fresh database
// (the payment and queue examples' CreateSchema): every call succeeds and
// the tables are there. An error that is not a creation race comes back as
// it is, with its SQLSTATE.
func TestCreateIfNotExistsConcurrently(t *testing.T) {
	const schema = `
CREATE TABLE IF NOT EXISTS applied (
	seq BIGINT GENERATED ALWAYS AS IDENTITY,
	id  TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS balance (account TEXT PRIMARY KEY, balance BIGINT NOT NULL)`
	for round := range 5 {
		db := pg.NewDB(t)
		db.SetMaxOpenConns(8)
		for _, err := range atOnce(8, func(_ int, start <-chan struct{}) error {
			<-start
			return guard.CreateIfNotExists(ctx(t), db, schema, `CREATE INDEX IF NOT EXISTS balance_by ON balance (balance)`)
		}) {
			if err != nil {
				t.Errorf("round %d: CreateIfNotExists at once with 7 others: %v", round, err)
			}
		}
		if _, err := db.ExecContext(ctx(t), `INSERT INTO applied (id) VALUES ('a'); INSERT INTO balance VALUES ('a', 1)`); err != nil {
			t.Errorf("round %d: the tables after CreateIfNotExists: %v", round, err)
		}
	}
	db := pg.NewDB(t)
	err := guard.CreateIfNotExists(ctx(t), db, `CREATE TABLE IF NOT EXISTS ok (id INT)`, `CREATE TABLE IF NOT EXIST broken (id INT)`)
	var pgErr interface{ SQLState() string }
	if !errors.As(err, &pgErr) || pgErr.SQLState() != "42601" {
		t.Fatalf("CreateIfNotExists with a syntax error = %v, want PostgreSQL's 42601", err)
	}
}

// TestFencedApprovalAtEveryIsolation: 64 holders with racing tokens run
// the fenced read-modify-write (read the status; if pending, approve and
// log a charge) on PostgreSQL at each isolation level, and on SQLite.
// Exactly one charge, and the tokens of the transactions that committed,
// in commit order, strictly increase; every result is nil, ErrStale or
// ErrRetry.
func TestFencedApprovalAtEveryIsolation(t *testing.T) {
	dbs := map[string]func(t *testing.T) *sql.DB{
		"sqlite": func(t *testing.T) *sql.DB { db := databases(t)["sqlite"]; setup(t, db); return db },
	}
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		dbs["postgres "+level] = func(t *testing.T) *sql.DB { return isolatedDB(t, level) }
	}
	for name, open := range dbs {
		t.Run(name, func(t *testing.T) {
			db := open(t)
			db.SetMaxOpenConns(16)
			if _, err := db.ExecContext(ctx(t), `CREATE TABLE charge (token BIGINT NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			var next atomic.Int64
			var out outcomes
			var wg sync.WaitGroup
			for range 64 {
				wg.Go(func() {
					token := next.Add(1)
					err := guard.Tx(ctx(t), db, "payment:1001", fence.Token(token), func(tx *sql.Tx) error {
						if _, err := tx.ExecContext(ctx(t),
							`INSERT INTO accepted (seq, token) SELECT COALESCE(MAX(seq), 0) + 1, $1 FROM accepted`, token); err != nil {
							return err
						}
						var status string
						if err := tx.QueryRowContext(ctx(t), `SELECT status FROM payment WHERE id = 1001`).Scan(&status); err != nil {
							return err
						}
						if status != "PENDING" {
							return nil
						}
						if _, err := tx.ExecContext(ctx(t), `UPDATE payment SET status = 'APPROVED' WHERE id = 1001`); err != nil {
							return err
						}
						_, err := tx.ExecContext(ctx(t), `INSERT INTO charge (token) VALUES ($1)`, token)
						return err
					})
					out.count(t, int64(token), err)
				})
			}
			wg.Wait()
			var charges int
			if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM charge`).Scan(&charges); err != nil {
				t.Fatal(err)
			}
			if charges != 1 {
				t.Errorf("%d charges, want 1", charges)
			}
			rows, err := db.QueryContext(ctx(t), `SELECT token FROM accepted ORDER BY seq`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var last, n int64
			for rows.Next() {
				var tok int64
				if err := rows.Scan(&tok); err != nil {
					t.Fatal(err)
				}
				if tok <= last {
					t.Errorf("token %d committed after %d", tok, last)
				}
				last, n = tok, n+1
			}
			if n != out.ok.Load() {
				t.Errorf("%d transactions logged, %d reported committed", n, out.ok.Load())
			}
			t.Logf("%d committed, %d stale, %d retry", out.ok.Load(), out.stale.Load(), out.retry.Load())
		})
	}
}

// TestTxInsideMiddlewareOnSameResource: a handler behind Middleware over
// SQLStore calls a function of the service that runs its own guard.Tx on
// the same resource (given the namespaced name, as HTTPOptions.Namespace's
// doc suggests for sharing a resource with Tx). Its fence waits for the
// request's transaction's row lock, which waits for the handler: neither
// the database nor the guard can see the cycle, and the request hangs until
// its context ends (never, on an http.Server without timeouts, while every
// other request on the resource queues behind it). Tx must fail at once.
func TestTxInsideMiddlewareOnSameResource(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			other, err := sql.Open("sqlite", guard.SQLiteDSN(filepath.Join(t.TempDir(), "other.db")))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = other.Close() })
			if err := guard.CreateTables(ctx(t), other); err != nil {
				t.Fatal(err)
			}
			mw := guard.Middleware(guard.SQLStore{DB: db}, guard.HTTPOptions{Resource: oneResource})
			const limit = 2 * time.Second
			rctx, cancel := context.WithTimeout(ctx(t), limit)
			defer cancel()
			start := time.Now()
			var inner, elsewhere error
			req := httptest.NewRequestWithContext(rctx, http.MethodPost, "/", nil)
			req.Header.Set(guard.TokenHeader, "5")
			w := httptest.NewRecorder()
			mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tx, ok := guard.TxFrom(r.Context()); !ok || tx == nil {
					t.Errorf("TxFrom = %v, %v in the handler", tx, ok)
				}
				elsewhere = guard.Tx(r.Context(), other, "payment:1001", 5, func(*sql.Tx) error { return nil })
				inner = guard.Tx(r.Context(), db, "http:payment:1001", 5, func(*sql.Tx) error { return nil })
				if inner != nil {
					http.Error(w, "inner", http.StatusInternalServerError)
				}
			})).ServeHTTP(w, req)
			took := time.Since(start)
			t.Logf("inner Tx: %v after %v; answer %d", inner, took, w.Code)
			if took >= limit/2 {
				t.Fatalf("the request hung for %v (until its context ended): inner Tx on the request's own resource: %v", took, inner)
			}
			if !errors.Is(inner, guard.ErrNestedTx) {
				t.Fatalf("inner Tx on the store's database = %v, want ErrNestedTx", inner)
			}
			if elsewhere != nil {
				t.Fatalf("Tx on another database in the handler: %v", elsewhere)
			}
		})
	}
}

// retryStore is what a user may wrap SQLStore in: Do is retried when the
// database asks for a retry (ErrRetry), with the same token: the fence
// decides again, so this is safe for the token's order.
type retryStore struct{ guard.Store }

func (s retryStore) Do(c context.Context, resource string, token fence.Token, fn func(context.Context) error) error {
	for try := 1; ; try++ {
		err := s.Store.Do(c, resource, token, fn)
		if !errors.Is(err, guard.ErrRetry) || try == 3 {
			return err
		}
	}
}

// TestMiddlewareStoreRunsHandlerTwice: a Store that runs fn again after a
// failed attempt (retryStore over SQLStore; the first commit fails with a
// serialization failure, raised at commit by a deferred constraint trigger
// on a real PostgreSQL). The first run answered 200, the second 409. The
// client must get the second run's answer alone, and the second run's
// refusal must roll back: the response of a run whose transaction did not
// commit must not leak into the answer, nor its status decide the commit.
func TestMiddlewareStoreRunsHandlerTwice(t *testing.T) {
	db := pg.NewDB(t)
	for _, stmt := range []string{
		`CREATE TABLE state (id INTEGER PRIMARY KEY, v BIGINT NOT NULL)`,
		`INSERT INTO state VALUES (1, 0)`,
		`CREATE SEQUENCE commits`,
		`CREATE FUNCTION fail_first_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('commits') = 1 THEN
				RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';
			END IF;
			RETURN NULL;
		END $$`,
		`CREATE CONSTRAINT TRIGGER fail_first_commit AFTER UPDATE ON state
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_first_commit()`,
	} {
		if _, err := db.ExecContext(ctx(t), stmt); err != nil {
			t.Fatal(err)
		}
	}
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	mw := guard.Middleware(retryStore{guard.SQLStore{DB: db}}, guard.HTTPOptions{Resource: oneResource,
		Logger: slog.New(slog.DiscardHandler)})
	runs := 0
	w := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("payload"))
	req.Header.Set(guard.TokenHeader, "5")
	mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		if body, err := io.ReadAll(r.Body); err != nil || string(body) != "payload" {
			t.Errorf("run %d read the body %q (%v), want the whole of it", runs, body, err)
		}
		tx, _ := guard.TxFrom(r.Context())
		if _, err := tx.ExecContext(r.Context(), `UPDATE state SET v = $1 WHERE id = 1`, runs); err != nil {
			t.Error(err)
		}
		if runs == 1 {
			_, _ = io.WriteString(w, "approved by run 1\n")
			return
		}
		http.Error(w, "refused by run 2", http.StatusConflict)
	})).ServeHTTP(w, req)
	var v int64
	if err := db.QueryRowContext(ctx(t), `SELECT v FROM state WHERE id = 1`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d runs; answer %d %q; state %d", runs, w.Code, w.Body, v)
	if runs != 2 {
		t.Fatalf("the handler ran %d times, want 2 (the first commit fails once)", runs)
	}
	if w.Code != http.StatusConflict || strings.Contains(w.Body.String(), "run 1") {
		t.Errorf("answer %d %q; want the second run's 409 alone", w.Code, w.Body)
	}
	if v != 0 {
		t.Errorf("state %d: the second run answered 409 and its write was committed anyway", v)
	}
}

// noRunStore breaks the Store contract: it returns nil without running fn
// (as a store that takes a token seen before for a replay already done
// might).
type noRunStore struct{}

func (noRunStore) Do(context.Context, string, fence.Token, func(context.Context) error) error {
	return nil
}

// TestMiddlewareStoreDoesNotRunHandler: Middleware over a Store that
// returns nil without running the handler must not tell the client its
// request succeeded (nor crash): the store failed, 503.
func TestMiddlewareStoreDoesNotRunHandler(t *testing.T) {
	mw := guard.Middleware(noRunStore{}, guard.HTTPOptions{Resource: oneResource, Logger: slog.New(slog.DiscardHandler)})
	w, p := serveOnce(mw, func(w http.ResponseWriter, r *http.Request) { t.Error("the handler ran") }, "5")
	if p != nil || w.Code != http.StatusServiceUnavailable {
		t.Fatalf("answer %d %q, panic %v; want 503", w.Code, w.Body, p)
	}
}

// TestSQLiteBusyWaitWithinDeadline: on SQLite (SQLiteDSN: a 10 s busy
// timeout) a fenced transaction waits for another connection's write lock.
// A caller whose context ends after 200 ms must get its error then, not
// after the busy timeout.
func TestSQLiteBusyWaitWithinDeadline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "busy.db")
	db, err := sql.Open("sqlite", guard.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	setup(t, db)
	hold, err := db.BeginTx(ctx(t), nil) // BEGIN IMMEDIATE: the write lock
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	for _, end := range []string{"deadline", "cancel"} {
		t.Run(end, func(t *testing.T) {
			const wait, slack = 200 * time.Millisecond, 800 * time.Millisecond
			var c context.Context
			var cancel context.CancelFunc
			if end == "deadline" {
				c, cancel = context.WithTimeout(context.Background(), wait)
			} else {
				c, cancel = context.WithCancel(context.Background())
				time.AfterFunc(wait, cancel)
			}
			defer cancel()
			start := time.Now()
			err := approveTx(c, db, 5, "w5")
			if took := time.Since(start); took > wait+slack || !errors.Is(err, c.Err()) || c.Err() == nil {
				t.Fatalf("a fenced transaction waiting for SQLite's write lock: %v after %v; want the context's error within %v", err, took, wait+slack)
			}
			t.Logf("%v after %v", err, time.Since(start))
		})
	}
}

// TestSearchPathSharesFenceTokens: two services fence payment 1001 in one
// PostgreSQL database, one of them with its own schema first in its
// search_path. CreateTables counted the tables in current_schema(), found
// none in svc_b and gave that service a fence_tokens of its own there, and
// its stale token 5 was accepted after the other service's 9 (approved_by
// "w5": 9's write overwritten). CreateTables now counts the tables visible
// on the path, those its unqualified statements use: it creates none in
// svc_b, and token 5 is refused.
func TestSearchPathSharesFenceTokens(t *testing.T) {
	db := pg.NewDB(t)
	setup(t, db)
	var name string
	if err := db.QueryRowContext(ctx(t), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx(t), `CREATE SCHEMA svc_b`); err != nil {
		t.Fatal(err)
	}
	other, err := sql.Open("pgx", pg.DSN(name)+"&search_path=svc_b,public")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := guard.CreateTables(ctx(t), other); err != nil {
		t.Fatal(err)
	}
	var made int
	if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'svc_b'`).Scan(&made); err != nil || made != 0 {
		t.Errorf("CreateTables through search_path svc_b,public made %d tables in svc_b (%v), want none", made, err)
	}
	if err := approveTx(ctx(t), db, 9, "w9"); err != nil {
		t.Fatal(err)
	}
	err = approveTx(ctx(t), other, 5, "w5")
	if _, by, _ := row(t, db); !errors.Is(err, guard.ErrStale) || by.String != "w9" {
		t.Fatalf("token 5 through the other search_path after 9: %v, approved_by %q; want guard.ErrStale and w9's write kept", err, by.String)
	}
}

// TestRedisStoreClusterSlotMoves: redisstore.Store on a Redis Cluster while
// the slot of a resource's key moves between masters three times (MIGRATE:
// ASK and MOVED redirections). One goroutine accepts increasing tokens; two
// others keep sending the last accepted token, which is never greater than
// the stored one: none of those may be accepted.
func TestRedisStoreClusterSlotMoves(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	defer c.Close()
	store := redisstore.Store{Client: c}
	const resource = "payment:1001"
	key := "fence:guard:{" + resource + "}"
	node, err := c.MasterForKey(ctx(t), key)
	if err != nil {
		t.Fatal(err)
	}
	var from *redistest.Server
	for _, s := range cluster.Servers {
		if s.Addr == node.Options().Addr {
			from = s
		}
	}
	slot := int(c.ClusterKeySlot(ctx(t), key).Val())
	var last atomic.Int64
	if err := store.Accept(ctx(t), resource, 100); err != nil {
		t.Fatal(err)
	}
	last.Store(100)
	stop := make(chan struct{})
	var accepted, refused, failed atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for tok := int64(101); ; tok++ {
			select {
			case <-stop:
				return
			default:
			}
			switch err := store.Accept(ctx(t), resource, fence.Token(tok)); {
			case err == nil:
				last.Store(tok)
				accepted.Add(1)
			case errors.Is(err, guard.ErrStale):
				t.Errorf("token %d, greater than every one sent before, refused: %v", tok, err)
			default:
				failed.Add(1) // a redirection in flight; the token is skipped
			}
		}
	})
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				tok := last.Load()
				switch err := store.Accept(ctx(t), resource, fence.Token(tok)); {
				case err == nil:
					t.Errorf("token %d accepted again", tok)
				case errors.Is(err, guard.ErrStale):
					refused.Add(1)
				default:
					failed.Add(1)
				}
			}
		})
	}
	for _, to := range []int{1, 2, 0} {
		dest := cluster.Servers[to]
		if dest == from {
			dest = cluster.Servers[(to+1)%3]
		}
		if err := cluster.MigrateSlot(ctx(t), slot, from, dest); err != nil {
			t.Fatal(err)
		}
		from = dest
	}
	close(stop)
	wg.Wait()
	if err := store.Accept(ctx(t), resource, fence.Token(last.Load())); !errors.Is(err, guard.ErrStale) {
		t.Fatalf("the last accepted token %d again after the moves: %v, want ErrStale", last.Load(), err)
	}
	t.Logf("%d accepted, %d stale refused, %d errors", accepted.Load(), refused.Load(), failed.Load())
	if accepted.Load() == 0 || refused.Load() == 0 {
		t.Fatal("the test did not exercise the store")
	}
}

// TestInt64EdgeTokens: tokens at the top of the int64 range, and tokens
// that differ from an accepted one only beyond a float64's precision
// (2^53 + 1 after 2^53 + 2), through Tx, Table.Update and redisstore: the
// comparison is exact and nothing overflows; zero and negative tokens are
// refused before the database.
func TestInt64EdgeTokens(t *testing.T) {
	const top = fence.Token(math.MaxInt64)
	const f = fence.Token(1 << 53)
	type step struct {
		token fence.Token
		ok    bool
	}
	steps := []step{{f + 2, true}, {f + 1, false}, {f + 3, true}, {top - 1, true}, {top - 1, false}, {top, true}, {top, false}, {f + 4, false}}
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			for _, s := range steps {
				err := guard.Tx(ctx(t), db, "payment:1001", s.token, func(*sql.Tx) error { return nil })
				if (err == nil) != s.ok || (err != nil && !errors.Is(err, guard.ErrStale)) {
					t.Errorf("Tx token %d: %v, want accepted %v", s.token, err, s.ok)
				}
				err = payments.Update(ctx(t), db, 1001, s.token, "approved_by = $3", fmt.Sprint(s.token))
				if (err == nil) != s.ok || (err != nil && !errors.Is(err, guard.ErrStale)) {
					t.Errorf("Update token %d: %v, want accepted %v", s.token, err, s.ok)
				}
			}
			for _, bad := range []fence.Token{0, -1, math.MinInt64} {
				if err := guard.Tx(ctx(t), db, "payment:1001", bad, func(*sql.Tx) error { return nil }); !errors.Is(err, guard.ErrInvalidToken) {
					t.Errorf("Tx token %d: %v, want ErrInvalidToken", bad, err)
				}
				if err := payments.Update(ctx(t), db, 1001, bad, "approved_by = $3", "bad"); !errors.Is(err, guard.ErrInvalidToken) {
					t.Errorf("Update token %d: %v, want ErrInvalidToken", bad, err)
				}
			}
		})
	}
	t.Run("redis", func(t *testing.T) {
		store := redisStore(t)
		for _, s := range steps {
			err := store.Accept(ctx(t), "payment:1001", s.token)
			if (err == nil) != s.ok || (err != nil && !errors.Is(err, guard.ErrStale)) {
				t.Errorf("Accept token %d: %v, want accepted %v", s.token, err, s.ok)
			}
		}
	})
}

// TestRedirectAfterWriteCommits: a handler behind Middleware over SQLStore
// writes and answers 303 See Other (POST, then redirect, then GET: the
// usual answer to a form's successful POST). Middleware committed only on
// 2xx, so the write was rolled back while the client was sent to the page
// of what it took for done, and nothing was logged ("answer 303, state
// 0"). 3xx commits now, as 2xx does; 4xx still rolls back.
func TestRedirectAfterWriteCommits(t *testing.T) {
	s := stateStores(t)["sql-postgres"]
	mw := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource})
	w, _ := serveOnce(mw, func(w http.ResponseWriter, r *http.Request) {
		if err := s.write(r, 5); err != nil {
			t.Error(err)
		}
		http.Redirect(w, r, "/payments/1001", http.StatusSeeOther)
	}, "5")
	if w.Code != http.StatusSeeOther || s.read(t) != 5 {
		t.Fatalf("answer %d, state %d: the client was redirected as after a success, and the write was rolled back", w.Code, s.read(t))
	}
	w, _ = serveOnce(mw, func(w http.ResponseWriter, r *http.Request) {
		if err := s.write(r, 6); err != nil {
			t.Error(err)
		}
		http.Error(w, "refused", http.StatusUnprocessableEntity)
	}, "6")
	if w.Code != http.StatusUnprocessableEntity || s.read(t) != 5 {
		t.Fatalf("a 422 after a write: answer %d, state %d; want 422 and the write rolled back (5)", w.Code, s.read(t))
	}
}
