package guard_test

import (
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	"github.com/fencekit/fence/guard"
)

// TestDeadlockInFnIsRetry: two fenced transactions on different resources
// lock the same two payment rows in opposite orders, so PostgreSQL aborts
// one with a deadlock (40P01). Tx must report it as ErrRetry, and the other
// transaction commits.
func TestDeadlockInFnIsRetry(t *testing.T) {
	db := pg.NewDB(t)
	setup(t, db)
	if _, err := db.ExecContext(ctx(t), `INSERT INTO payment (id, status) VALUES (1002, 'PENDING')`); err != nil {
		t.Fatal(err)
	}
	// Each side locks its first row, says so, waits for the other side's
	// first lock, then locks its second row: a deadlock, whoever gets there
	// first. deadlock_timeout is lowered so that PostgreSQL finds it soon.
	side := func(resource string, first, second int64, mine chan<- struct{}, theirs <-chan struct{}) error {
		return guard.Tx(ctx(t), db, resource, 1, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx(t), `SET LOCAL deadlock_timeout = '50ms'`); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx(t), `UPDATE payment SET approved_by = $1 WHERE id = $2`, resource, first); err != nil {
				return err
			}
			close(mine)
			<-theirs
			_, err := tx.ExecContext(ctx(t), `UPDATE payment SET approved_by = $1 WHERE id = $2`, resource, second)
			return err
		})
	}
	aLocked, bLocked := make(chan struct{}), make(chan struct{})
	errs := make(chan error, 2)
	go func() { errs <- side("a", 1001, 1002, aLocked, bLocked) }()
	go func() { errs <- side("b", 1002, 1001, bLocked, aLocked) }()
	var retry, ok int
	for range 2 {
		switch err := <-errs; {
		case err == nil:
			ok++
		case errors.Is(err, guard.ErrRetry):
			retry++
		default:
			t.Errorf("deadlocked transaction: %v, want ErrRetry", err)
		}
	}
	if ok != 1 || retry != 1 {
		t.Fatalf("%d committed, %d ErrRetry; want one of each", ok, retry)
	}
}

// TestSQLiteDSNTakesWriteLockAtBegin: SQLiteDSN's transactions take the
// write lock when they begin (_txlock=immediate), as its documentation
// says, so that a transaction that reads first and writes later never has
// to upgrade its lock (which fails with SQLITE_BUSY whatever the busy
// timeout). Shown from a second handle without a busy timeout: while a
// transaction that has not run a statement yet is open, its write fails
// with SQLITE_BUSY at once.
func TestSQLiteDSNTakesWriteLockAtBegin(t *testing.T) {
	path := filepath.Join(t.TempDir(), "immediate.db")
	db, err := sql.Open("sqlite", guard.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	setup(t, db)
	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = other.ExecContext(ctx(t), `UPDATE payment SET approved_by = 'other' WHERE id = 1001`)
	if err == nil {
		t.Fatal("another connection wrote while a SQLiteDSN transaction was open: BEGIN did not take the write lock")
	}
	if !errors.Is(guard.Fence(ctx(t), other, "payment:1001", 1), guard.ErrRetry) {
		t.Fatalf("a write against the open transaction's lock: want SQLITE_BUSY as ErrRetry")
	}
}

// TestCommitSerializationFailureIsRetry: at SERIALIZABLE, PostgreSQL may
// report a serialization failure at COMMIT rather than at a statement. Two
// fenced transactions on different resources make a write skew (each
// reads the row the other writes, both write before either commits); the
// first commits, the second's fn returns nil and its COMMIT fails with
// 40001. Tx must report it as ErrRetry, as it does for a failure inside fn.
func TestCommitSerializationFailureIsRetry(t *testing.T) {
	db := pg.NewDB(t)
	setup(t, db)
	var name string
	if err := db.QueryRowContext(ctx(t), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx(t), `ALTER DATABASE `+name+` SET default_transaction_isolation = 'serializable'`); err != nil {
		t.Fatal(err)
	}
	db.SetMaxIdleConns(0) // drop the connection opened before the ALTER
	db.SetMaxIdleConns(2)
	if _, err := db.ExecContext(ctx(t), `INSERT INTO payment (id, status) VALUES (1002, 'PENDING')`); err != nil {
		t.Fatal(err)
	}
	step := func(tx *sql.Tx, stmt string, id int64) error {
		_, err := tx.ExecContext(ctx(t), stmt, id)
		return err
	}
	const read, write = `SELECT status FROM payment WHERE id = $1`, `UPDATE payment SET approved_by = 'skew' WHERE id = $1`
	aRead, bRead, aWrote, bWrote, aDone := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	var bFn error
	bErr := make(chan error, 1)
	go func() {
		bErr <- guard.Tx(ctx(t), db, "b", 1, func(tx *sql.Tx) error {
			<-aRead
			if bFn = step(tx, read, 1001); bFn != nil {
				close(bRead)
				return bFn
			}
			close(bRead)
			<-aWrote
			bFn = step(tx, write, 1002)
			close(bWrote)
			if bFn != nil {
				return bFn
			}
			<-aDone // B commits after A has committed
			return nil
		})
	}()
	aErr := guard.Tx(ctx(t), db, "a", 1, func(tx *sql.Tx) error {
		err := step(tx, read, 1002)
		close(aRead)
		if err != nil {
			return err
		}
		<-bRead
		if err := step(tx, write, 1001); err != nil {
			close(aWrote)
			return err
		}
		close(aWrote)
		<-bWrote
		return nil
	})
	close(aDone)
	err := <-bErr
	if aErr != nil || bFn != nil {
		t.Fatalf("A's transaction: %v; B's statements: %v; want both to get as far as B's commit", aErr, bFn)
	}
	if !errors.Is(err, guard.ErrRetry) {
		t.Fatalf("a serialization failure at commit: %v, want ErrRetry", err)
	}
}
