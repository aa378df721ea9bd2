package guard

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// ErrRetry means the database gave up on a fenced transaction (or a
// statement of Table.Update, Table.UpdateVersion or Once) because of a
// concurrent one: a PostgreSQL serialization failure (SQLSTATE 40001, at
// REPEATABLE READ or SERIALIZABLE), deadlock (40P01) or lock wait longer
// than lock_timeout (55P03, lock_not_available; NOWAIT's too), or SQLite's
// SQLITE_BUSY or SQLITE_LOCKED after its busy timeout. Nothing was written
// and the token was not recorded. The caller should retry the whole
// approval — take a new lease, then read and write again — and must not
// simply replay its writes with the same token and the data it read before.
var ErrRetry = errors.New("guard: transaction conflict, retry with a new lease")

// SQLiteParams are the modernc.org/sqlite connection settings that fenced
// transactions from many goroutines need: the WAL journal, so that readers
// and the writer do not block each other; a 10 s busy timeout, so that a
// writer waits for the lock instead of failing at once with SQLITE_BUSY;
// and _txlock=immediate, so that every transaction takes the write lock
// when it begins. Without it a transaction that reads first and writes
// later must upgrade its lock, and that fails with SQLITE_BUSY at once
// whatever the busy timeout.
//
// SQLite has one writer per database: a fenced transaction holds the whole
// file, not one resource, and its busy handler is not fair to waiters (a
// writer that keeps coming back can win every time). A holder paused inside
// a transaction blocks every other writer until it resumes or its context
// ends, so bound fenced work with a context deadline (the lease's, or a few
// lease times).
const SQLiteParams = "_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"

// SQLiteDSN returns the modernc.org/sqlite data source name of the database
// file at path with SQLiteParams:
//
//	db, err := sql.Open("sqlite", guard.SQLiteDSN("payments.db"))
//
// Characters that a file: URI treats specially (%, ? and #) are escaped.
// A shared-cache database (cache=shared, in memory or not) does not suit
// fenced transactions: with modernc.org/sqlite a transaction that meets
// another one's table lock waits for it with no bound but ctx (the busy
// timeout does not apply), and gets no SQLITE_LOCKED, so no ErrRetry.
func SQLiteDSN(path string) string {
	return "file:" + uriEscaper.Replace(path) + "?" + SQLiteParams
}

var uriEscaper = strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23")

// retryable wraps err with ErrRetry when the database reported a conflict
// with a concurrent transaction; otherwise it returns err unchanged. It
// knows the drivers by the methods of their errors, so that guard imports
// neither: pgx's *pgconn.PgError has SQLState, modernc.org/sqlite's *Error
// has Code.
func retryable(err error) error {
	if err == nil || errors.Is(err, ErrRetry) {
		return err
	}
	if s := sqlState(err); s == "40001" || s == "40P01" || s == "55P03" {
		return fmt.Errorf("%w: %w", ErrRetry, err)
	}
	var lite interface{ Code() int }
	if errors.As(err, &lite) && isSQLiteError(lite) {
		// The primary result code is the low byte of an extended one.
		if c := lite.Code() & 0xff; c == sqliteBusy || c == sqliteLocked {
			return fmt.Errorf("%w: %w", ErrRetry, err)
		}
	}
	return err
}

// SQLite's primary result codes for a database locked by another
// connection (SQLITE_BUSY) and a table locked in a shared cache
// (SQLITE_LOCKED).
const (
	sqliteBusy   = 5
	sqliteLocked = 6
)

// isSQLiteError reports whether e is modernc.org/sqlite's error type, so that
// another driver's Code method is not taken for SQLite's result code.
func isSQLiteError(e any) bool {
	t := reflect.TypeOf(e)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath() == "modernc.org/sqlite" && t.Name() == "Error"
}
