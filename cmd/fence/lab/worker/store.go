package worker

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/jackc/pgx/v5/stdlib" // the PostgreSQL rows' driver
	_ "modernc.org/sqlite"           // the lab's database
)

// Schema is the lab's database: a payment-shaped row per register (its
// ledger of applied operations and the last fencing token that wrote it)
// and lab_log, the resource's record of what it accepted and rejected. An
// accepted entry is written in the same transaction as the write, so the
// log holds exactly what the database committed, in commit order.
const Schema = `
CREATE TABLE IF NOT EXISTS payment (
	id                 TEXT PRIMARY KEY,
	ops                TEXT   NOT NULL DEFAULT '[]',
	last_fencing_token BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS lab_log (
	seq      INTEGER PRIMARY KEY AUTOINCREMENT,
	op       TEXT    NOT NULL,
	worker   TEXT    NOT NULL,
	kind     TEXT    NOT NULL,
	key      TEXT    NOT NULL,
	token    BIGINT  NOT NULL,
	accepted INTEGER NOT NULL,
	value    TEXT    NOT NULL,
	mono     BIGINT  NOT NULL
)`

// SchemaPostgres is Schema in PostgreSQL's dialect (the PostgreSQL rows).
const SchemaPostgres = `
CREATE TABLE IF NOT EXISTS payment (
	id                 TEXT PRIMARY KEY,
	ops                TEXT   NOT NULL DEFAULT '[]',
	last_fencing_token BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS lab_log (
	seq      BIGSERIAL PRIMARY KEY,
	op       TEXT    NOT NULL,
	worker   TEXT    NOT NULL,
	kind     TEXT    NOT NULL,
	key      TEXT    NOT NULL,
	token    BIGINT  NOT NULL,
	accepted BOOLEAN NOT NULL,
	value    TEXT    NOT NULL,
	mono     BIGINT  NOT NULL
)`

// How a worker does its read-modify-write (Spec.Write).
const (
	// WriteGuard is the fenced read-modify-write as guard documents it:
	// guard.Tx fences the transaction with the lease's token, then the row
	// is read and written in it. Protected runs use it.
	WriteGuard = "guard"
	// WriteNaive reads the row, then writes it with a plain UPDATE that
	// ignores the token. Controls use it.
	WriteNaive = "naive"
	// WriteTokenOnly is the article's token-only update, as the payment
	// example's ApproveTokenOnly: the row is read outside the transaction,
	// then written by guard.Table.Update (WHERE last_fencing_token < token).
	// A mutation: it loses updates when a stale holder writes first.
	WriteTokenOnly = "token-only"
	// WriteWeak is guard.Tx with its comparison weakened: the fence accepts
	// any token (equal or lower too). A mutation for the lab's own tests.
	WriteWeak = "weak"
)

var payments = guard.Table{Name: "payment", Key: "id", Column: "last_fencing_token"}

// OpenDB opens the lab's database: a PostgreSQL connection string
// (postgres://…) with pgx's database/sql driver, or else the path of a
// SQLite file, with guard.SQLiteDSN.
func OpenDB(path string) (*sql.DB, error) {
	if IsPostgres(path) {
		return sql.Open("pgx", path)
	}
	return sql.Open("sqlite", guard.SQLiteDSN(path))
}

// IsPostgres reports whether path, as OpenDB takes it, names a PostgreSQL
// database.
func IsPostgres(path string) bool { return strings.HasPrefix(path, "postgres://") }

// postgres reports whether db was opened with pgx's driver.
func postgres(db *sql.DB) bool {
	_, ok := db.Driver().(*stdlib.Driver)
	return ok
}

// CreateSchema creates the lab's tables and guard's.
func CreateSchema(ctx context.Context, db *sql.DB) error {
	if ctx == nil {
		return nilctx.Err("worker", "CreateSchema")
	}
	schema := Schema
	if postgres(db) {
		schema = SchemaPostgres
	}
	if err := guard.CreateIfNotExists(ctx, db, schema); err != nil {
		return err
	}
	return guard.CreateTables(ctx, db)
}

// EnsureRow creates the payment row key if it does not exist yet; Apply
// needs it. The lab's controller calls it before it starts the workers,
// and each worker once more before its leases, so that its
// read-modify-writes take SQLite's write lock once each. A row that is
// there is only read: in WAL mode a read does not wait for the writer, and
// a worker that starts while another is paused inside its transaction
// (holding SQLite's write lock for as long as the pause) would otherwise
// wait out the busy timeout (10 s) and exit, as it did in ci88 when the
// machine's load started the other workers after the victim's first pause.
func EnsureRow(ctx context.Context, q guard.Querier, key string) error {
	if ctx == nil {
		return nilctx.Err("worker", "EnsureRow")
	}
	var one int
	switch err := q.QueryRowContext(ctx, `SELECT 1 FROM payment WHERE id = $1`, key).Scan(&one); {
	case err == nil:
		return nil
	case !errors.Is(err, sql.ErrNoRows):
		return err
	}
	_, err := q.ExecContext(ctx, `INSERT INTO payment (id) VALUES ($1) ON CONFLICT (id) DO NOTHING`, key)
	return err
}

// Op is one read-modify-write of a register: append Op to its ledger.
type Op struct {
	ID     string
	Worker string
	Key    string
	Token  int64
}

// Apply does op's read-modify-write in mode, on a row EnsureRow created. between, if set, is called
// after the read with what was read, before the write (the worker reports
// the read and may pause there). It returns what was read and written; an
// error matching guard.ErrStale when the resource rejected the token.
func Apply(ctx context.Context, db *sql.DB, mode string, op Op, between func(read []string)) (read, written []string, err error) {
	if ctx == nil {
		return nil, nil, nilctx.Err("worker", "Apply")
	}
	// rmw reads through q and writes through tx: the same transaction for
	// the fenced modes, the read outside it for the naive ones.
	rmw := func(tx *sql.Tx, q guard.Querier, conditional bool) error {
		if read, err = readOps(ctx, q, op.Key); err != nil {
			return err
		}
		if between != nil {
			between(read)
		}
		written = append(append([]string(nil), read...), op.ID)
		if tx == nil {
			return inTx(ctx, db, func(tx *sql.Tx) error { return writeOps(ctx, tx, op, written, conditional) })
		}
		return writeOps(ctx, tx, op, written, conditional)
	}
	switch mode {
	case WriteGuard:
		err = guard.Tx(ctx, db, op.Key, fence.Token(op.Token), func(tx *sql.Tx) error { return rmw(tx, tx, false) })
	case WriteWeak:
		greatest := "max" // SQLite's two-argument max
		if postgres(db) {
			greatest = "GREATEST"
		}
		err = inTx(ctx, db, func(tx *sql.Tx) error {
			if err := weakFence(ctx, tx, greatest, op.Key, op.Token); err != nil {
				return err
			}
			return rmw(tx, tx, false)
		})
	case WriteNaive, WriteTokenOnly:
		err = rmw(nil, db, mode == WriteTokenOnly)
	default:
		return nil, nil, fmt.Errorf("lab worker: unknown write mode %q", mode)
	}
	if errors.Is(err, guard.ErrStale) {
		logEntry(ctx, db, op, false, nil)
	}
	return read, written, err
}

// weakFence is guard.Fence with its comparison weakened (WriteWeak): it
// records the greater of the last token and token, and accepts any token.
// greatest is the SQL function that picks the greater (SQLite's max,
// PostgreSQL's GREATEST).
func weakFence(ctx context.Context, tx *sql.Tx, greatest, resource string, token int64) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO fence_tokens (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = `+greatest+`(fence_tokens.token, excluded.token)`, resource, token)
	return err
}

func inTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

func readOps(ctx context.Context, q guard.Querier, key string) ([]string, error) {
	var raw string
	if err := q.QueryRowContext(ctx, `SELECT ops FROM payment WHERE id = $1`, key).Scan(&raw); err != nil {
		return nil, err
	}
	var ops []string
	err := json.Unmarshal([]byte(raw), &ops)
	return ops, err
}

// writeOps writes the ledger and the log entry in tx; conditional is the
// token-only update.
func writeOps(ctx context.Context, tx *sql.Tx, op Op, ops []string, conditional bool) error {
	raw, _ := json.Marshal(ops)
	if conditional {
		if err := payments.Update(ctx, tx, op.Key, fence.Token(op.Token), "ops = $3", string(raw)); err != nil {
			return err
		}
	} else if _, err := tx.ExecContext(ctx, `UPDATE payment SET ops = $2, last_fencing_token = $3 WHERE id = $1`, op.Key, string(raw), op.Token); err != nil {
		return err
	}
	return insertLog(ctx, tx, op, true, ops)
}

// WriteIn is the handler side of the HTTP resource: op's read-modify-write
// in tx, which guard's SQLStore opened and fenced (or a plain transaction,
// for the control).
func WriteIn(ctx context.Context, tx *sql.Tx, op Op) (read, written []string, err error) {
	if ctx == nil {
		return nil, nil, nilctx.Err("worker", "WriteIn")
	}
	if err := EnsureRow(ctx, tx, op.Key); err != nil {
		return nil, nil, err
	}
	if read, err = readOps(ctx, tx, op.Key); err != nil {
		return nil, nil, err
	}
	written = append(append([]string(nil), read...), op.ID)
	return read, written, writeOps(ctx, tx, op, written, false)
}

func insertLog(ctx context.Context, q guard.Querier, op Op, accepted bool, value []string) error {
	raw, _ := json.Marshal(value)
	if value == nil {
		raw = []byte("[]")
	}
	_, err := q.ExecContext(ctx, `INSERT INTO lab_log (op, worker, kind, key, token, accepted, value, mono) VALUES ($1, $2, 'write', $3, $4, $5, $6, $7)`,
		op.ID, op.Worker, op.Key, op.Token, accepted, string(raw), Mono())
	return err
}

// LogRejected records that the resource rejected op (outside any
// transaction: the rejected one was rolled back).
func LogRejected(ctx context.Context, db *sql.DB, op Op) { logEntry(ctx, db, op, false, nil) }

func logEntry(ctx context.Context, db *sql.DB, op Op, accepted bool, value []string) {
	_ = insertLog(ctx, db, op, accepted, value)
}
