package guard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/fencekit/fence/internal/pgdurable"
)

// Querier runs statements: *sql.DB, *sql.Tx and *sql.Conn satisfy it.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// The guard's own tables. The statements use $n placeholders and upserts
// that PostgreSQL and SQLite both understand. Tokens are compared by their
// difference, which SQLite computes on numbers even in a fence_tokens made
// beforehand with a TEXT token column (CreateTables keeps it): "<" there
// compared as text, and token 9 was accepted after 1800000000000003.
const (
	createTokens = `CREATE TABLE IF NOT EXISTS fence_tokens (
	resource TEXT PRIMARY KEY,
	token    BIGINT NOT NULL CHECK (token > 0),
	call_id  TEXT
)`
	// The migration of a fence_tokens made before call_id (guard before
	// call ids): the column is added only if it is missing, since ALTER
	// TABLE waits for every transaction fenced on the table, and every
	// fenced transaction begun after it waits behind it: one long fenced
	// transaction stalled all fenced traffic, on every resource, for as
	// long as it lasted. So the ALTER waits for its lock at most
	// addCallLockTimeout (unless the session has a lock_timeout of its
	// own), and gives up, leaving the table as it is: a later CreateTables
	// adds it. A role that does not own the table may not add it: the
	// table is left as it is too. (The exception block keeps a caller's
	// transaction usable and undoes the lock_timeout; on success it is set
	// back.) Fence with a call id says what to run.
	addCallPG = `DO $$ DECLARE prev text := current_setting('lock_timeout'); BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'fence_tokens'::regclass AND attname = 'call_id' AND NOT attisdropped) THEN
		BEGIN
			IF prev = '0' THEN
				PERFORM set_config('lock_timeout', '` + addCallLockTimeout + `', true);
			END IF;
			ALTER TABLE fence_tokens ADD COLUMN call_id TEXT;
			PERFORM set_config('lock_timeout', prev, true);
		EXCEPTION WHEN insufficient_privilege THEN
			RAISE NOTICE 'guard: fence_tokens has no call_id column and this role may not add it';
		WHEN lock_not_available THEN
			RAISE NOTICE 'guard: fence_tokens has no call_id column: a fenced transaction held the table; run CreateTables again';
		END;
	ELSIF (SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'fence_tokens'::regclass AND attname = 'call_id' AND NOT attisdropped) NOT IN ('text', 'character varying') THEN
		RAISE EXCEPTION 'guard: fence_tokens.call_id is %, which cannot hold every "<token>:<call id>": run ALTER TABLE fence_tokens ALTER COLUMN call_id TYPE TEXT USING NULL',
			(SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'fence_tokens'::regclass AND attname = 'call_id' AND NOT attisdropped)
			USING ERRCODE = 'datatype_mismatch';
	END IF;
END $$`
	addCallLockTimeout = "2s"
	hasCallSQLite      = `SELECT COUNT(*) FROM pragma_table_info('fence_tokens') WHERE name = 'call_id'`
	addCallSQLite      = `ALTER TABLE fence_tokens ADD COLUMN call_id TEXT`
	createIdempotency  = `CREATE TABLE IF NOT EXISTS fence_idempotency (
	key TEXT PRIMARY KEY
)`
	upsertToken = `INSERT INTO fence_tokens (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token
WHERE fence_tokens.token - excluded.token < 0`
	selectToken = `SELECT token FROM fence_tokens WHERE resource = $1`
	// With a call id (see WithCall), call_id records "<token>:<call>": the
	// token it was recorded with, so that a token moved on by Fence without
	// a call id (which leaves call_id as it was) never matches it.
	upsertTokenCall = `INSERT INTO fence_tokens (resource, token, call_id) VALUES ($1, $2, $3)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token, call_id = excluded.call_id
WHERE fence_tokens.token - excluded.token < 0`
	selectTokenCall = `SELECT token, call_id FROM fence_tokens WHERE resource = $1`
	// PostgreSQL's forms of the two upserts: the token is given through
	// pgdurable.Commit, so that the fence's transaction commits durably
	// (TestFenceSurvivesCrashUnderAsyncCommit). SQLite has no set_config,
	// and refuses them before running anything: it gets the plain ones.
	upsertTokenPG = `INSERT INTO fence_tokens (resource, token) VALUES ($1, CASE WHEN ` + pgdurable.Commit + ` THEN $2::bigint END)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token
WHERE fence_tokens.token - excluded.token < 0`
	upsertTokenCallPG = `INSERT INTO fence_tokens (resource, token, call_id) VALUES ($1, CASE WHEN ` + pgdurable.Commit + ` THEN $2::bigint END, $3)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token, call_id = excluded.call_id
WHERE fence_tokens.token - excluded.token < 0`
	// SQLite's TEMP tables of the guard's names, in visibleTablesPG's
	// form: a TEMP table shadows main's for its connection, and SQLite's
	// names ignore case.
	tempTablesSQLite = `SELECT
	(SELECT 't' || name FROM sqlite_temp_master WHERE name = 'fence_tokens' COLLATE NOCASE),
	(SELECT 't' || name FROM sqlite_temp_master WHERE name = 'fence_idempotency' COLLATE NOCASE)`
	// PostgreSQL's forms of the two CREATE TABLEs: each creates its table
	// only if none is visible on the search_path yet.
	createTokensPG      = `DO $$ BEGIN IF to_regclass('fence_tokens') IS NULL THEN ` + createTokens + `; END IF; END $$`
	createIdempotencyPG = `DO $$ BEGIN IF to_regclass('fence_idempotency') IS NULL THEN ` + createIdempotency + `; END IF; END $$`
	insertIdemKey       = `INSERT INTO fence_idempotency (key) VALUES ($1) ON CONFLICT (key) DO NOTHING`
	// PostgreSQL's form, whose transaction commits durably, as a fence's
	// (TestOnceKeySurvivesCrashUnderAsyncCommit). The condition is the
	// SELECT's, so that the key is typed by its column, as in the plain
	// insert: a key column of another type than text (a UUID) refused
	// the key cast to text (TestOnceKeyColumnOfOwnType).
	insertIdemKeyPG = `INSERT INTO fence_idempotency (key) SELECT $1 WHERE ` + pgdurable.Commit + ` ON CONFLICT (key) DO NOTHING`
	maxIdemKeyBytes = 512
)

// visibleTablesPG says whether each of the guard's tables is visible on
// the connection's search_path, on PostgreSQL: the one its unqualified
// statements use, in whichever schema of the path it is (see
// CreateTables). Each is NULL if none is, else the relpersistence of the
// least durable relation it reaches, followed by that one's name: 'p'
// permanent, 't' temporary (one session's), 'u' unlogged (emptied by a
// crash), the greatest. What a table reaches is itself and its partitions
// at every level (a partitioned table is 'p' whatever its partitions are;
// pg_partition_tree lists them, and a plain table alone); what a view
// reaches (a view is 'p' whatever it reads, and Fence writes through one
// that is updatable) is what the relations its rule reads reach
// (TestCreateTablesViewOverUnlogged). Rules ON DELETE are not followed: a
// DELETE writes no token, and what such a rule writes elsewhere holds
// none (TestCreateTablesDeleteRuleIntoUnloggedAccepted); an INSERT or
// UPDATE rule is, though PostgreSQL refuses Fence's ON CONFLICT beside
// one.
var visibleTablesPG = `SELECT ` + reachedPersistencePG("fence_tokens") + `, ` + reachedPersistencePG("fence_idempotency")

// reachedPersistencePG is visibleTablesPG's look-up of table.
func reachedPersistencePG(table string) string {
	return `(WITH RECURSIVE rels(oid) AS (
		SELECT to_regclass('` + table + `')::oid
	UNION
		SELECT x.oid FROM rels, LATERAL (
			SELECT relid::oid AS oid FROM pg_catalog.pg_partition_tree(rels.oid::regclass)
			UNION ALL
			SELECT d.refobjid FROM pg_catalog.pg_rewrite r JOIN pg_catalog.pg_depend d
				ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND d.objid = r.oid
				AND d.refclassid = 'pg_catalog.pg_class'::regclass AND d.refobjid <> r.ev_class
			WHERE r.ev_class = rels.oid AND r.ev_type <> '4') x)
	SELECT c.relpersistence::text || c.oid::regclass::text FROM pg_catalog.pg_class c
		WHERE c.oid IN (SELECT oid FROM rels) ORDER BY c.relpersistence DESC LIMIT 1)`
}

// CreateTables creates the guard's tables, fence_tokens (the last accepted
// token per resource, and the call id it was accepted with) and
// fence_idempotency (used idempotency keys), if they do not exist yet.
// Processes may call it at once (see CreateIfNotExists).
//
// A fence_tokens made before call ids has no call_id column: CreateTables
// adds it (ALTER TABLE fence_tokens ADD COLUMN call_id TEXT, nullable, so
// existing rows keep their tokens), once, waiting for the transactions
// fenced on the table meanwhile. On PostgreSQL, where fenced transactions
// begun after the ALTER queue behind it, it waits at most 2 s for them
// (unless the session sets a lock_timeout of its own), and if one lasts
// longer it leaves the table as it is and returns nil: a later
// CreateTables adds the column. On SQLite the same holds when another
// connection's write transaction outlasts the busy timeout. A role that does not own the
// table may not add it: CreateTables then leaves the table as it is, and
// the owner must run that statement. Nor need the role have CREATE on the
// schema (PostgreSQL 15 gives it on public to its owner only) once both
// tables are there: CreateTables then creates nothing. A call_id column of
// another type than TEXT (or an unbounded VARCHAR), added by hand, cannot hold what Fence
// records: CreateTables returns an error that names the statement to run. Fence and Tx without a call id (see
// WithCall) do not use the column; with one they fail, with a message that
// says to run CreateTables, until it is there. SQLStore (Middleware, for
// requests from Transport) then fences without the call id, as before.
//
// On PostgreSQL the names are unqualified, found through each connection's
// search_path, and CreateTables takes a table as there when it is visible
// on that path (to_regclass), in whichever schema: the table its
// statements and Fence's will use. A role whose own schema comes first on
// the path ("$user", public, PostgreSQL's default) thus uses public's
// tables rather than get empty ones of its own, and creates a missing one
// in its own schema, the first on the path. The look-up is made again
// under CreateIfNotExists's lock, so that a process that waited for it
// finds the tables that the one before it made; if it fails on
// PostgreSQL, CreateTables returns the error and creates nothing.
// A table of either name that is TEMP (which shadows the shared one for
// its session, or on SQLite main's for its connection) or UNLOGGED (which a crash empties), or a partitioned one
// with an UNLOGGED partition, or a view that reads such a table (through
// views and partitions at any depth; a view over permanent tables is used
// as the table would be), is refused with ErrInvalidTable, whether it
// was there or CreateTables made it (a search_path that lists pg_temp
// first makes it TEMP); Fence does not look again, so a TEMP fence_tokens
// made after CreateTables on a pooled connection is used there by the
// statements planned after it (with pgx, where the session had no TEMP
// table before; a statement it had prepared earlier goes on writing the
// shared table).
//
// A resource's row in fence_tokens is all the guard remembers of it: every
// process that fences the resource must reach the same table (two
// fence_tokens, one in a schema that one service's search_path finds first
// and one that another's finds, order nothing between their tokens), and a
// row must not be deleted (to prune the table, say) while a holder of an
// older token may still write: the next token is then accepted, stale or
// not.
func CreateTables(ctx context.Context, q Querier) error {
	if ctx == nil {
		return nilctx.Err("guard", "CreateTables")
	}
	// PostgreSQL checks CREATE on the schema before it looks whether the
	// table of a CREATE TABLE IF NOT EXISTS exists: a service's role
	// granted only the tables' rows was refused, the tables there
	// (TestCreateTablesWithoutCreateOnSchema). Where the count fails
	// (SQLite), the statements say.
	if err := checkQuerier(q); err != nil {
		return err
	}
	// Only the tables not visible on the search_path: CREATE TABLE IF NOT
	// EXISTS looks in current_schema() alone, and made a second,
	// empty fence_tokens in a role's own schema, first on the path, beside
	// public's (TestSearchPathSharesFenceTokens).
	var tokens, idem sql.NullString
	stmts := []string{createTokens, createIdempotency}
	lookedUp := false
	switch err := q.QueryRowContext(ctx, visibleTablesPG).Scan(&tokens, &idem); {
	case err == nil:
		if err := checkShared(tokens, idem, "pg_temp"); err != nil {
			return err
		}
		// Looked up again under CreateIfNotExists's lock: another
		// process may have made it in a schema of the path while this
		// one waited (TestCreateTablesRaceWithCreatorOnPath).
		lookedUp, stmts = true, nil
		if !tokens.Valid {
			stmts = append(stmts, createTokensPG)
		}
		if !idem.Valid {
			stmts = append(stmts, createIdempotencyPG)
		}
	case ctx.Err() != nil || sqlState(err) != "":
		// PostgreSQL's error, not SQLite's unknown function: the
		// statements would make the tables in current_schema(),
		// visible or not elsewhere (TestCreateTablesLookupErrorNotSQLite).
		return fmt.Errorf("guard: create tables: %w", err)
	default:
		// SQLite, where to_regclass is unknown. A failed look-up leaves
		// it to the statements to say what is wrong.
		if q.QueryRowContext(ctx, tempTablesSQLite).Scan(&tokens, &idem) == nil {
			if err := checkShared(tokens, idem, "temp"); err != nil {
				return err
			}
		}
	}
	if err := CreateIfNotExists(ctx, q, stmts...); err != nil {
		return fmt.Errorf("guard: create tables: %w", err)
	}
	if lookedUp && len(stmts) > 0 {
		// What was made, or found under the lock, is checked as what was
		// found before: a search_path that lists pg_temp first makes
		// unqualified tables TEMP (TestCreateTablesTempFirstOnPathRefused).
		if err := q.QueryRowContext(ctx, visibleTablesPG).Scan(&tokens, &idem); err != nil {
			return fmt.Errorf("guard: create tables: %w", err)
		}
		if err := checkShared(tokens, idem, "pg_temp"); err != nil {
			return err
		}
	}
	if err := addCallColumn(ctx, q); err != nil {
		return fmt.Errorf("guard: add fence_tokens.call_id: %w", err)
	}
	return nil
}

// checkShared refuses a guard table, found on the search_path as
// visibleTablesPG tells, that is not a permanent one: a TEMP table shadows
// the shared one for its session alone (pg_temp comes first on every
// path), and its tokens order nothing with other sessions'; an UNLOGGED
// one, or an UNLOGGED partition, is emptied when PostgreSQL restarts
// after a crash, and a stale token is then accepted
// (TestCreateTablesTempTableShadows, TestCreateTablesUnloggedPartitionRefused,
// TestCreateTablesSQLiteTempTableRefused). temp names the schema of TEMP
// tables: pg_temp, or SQLite's temp.
func checkShared(tokens, idem sql.NullString, temp string) error {
	for _, t := range []struct {
		table string
		found sql.NullString
	}{{"fence_tokens", tokens}, {"fence_idempotency", idem}} {
		if len(t.found.String) < 2 {
			continue
		}
		p, rel := t.found.String[:1], t.found.String[1:]
		var what, fix string
		switch p {
		case "t":
			what, fix = "a TEMP table, seen by this session alone", "DROP TABLE "+temp+"."+t.table
			if temp == "pg_temp" {
				fix += "; a search_path that lists pg_temp first makes CREATE TABLE make TEMP tables"
			}
		case "u":
			what, fix = "an UNLOGGED table, emptied by a crash", "ALTER TABLE "+rel+" SET LOGGED"
			if rel != t.table {
				what = "a table with an UNLOGGED partition, or a view reading an UNLOGGED table, " + rel + ", emptied by a crash"
			}
		default:
			continue
		}
		return fmt.Errorf("%w: guard: create tables: the %s this connection uses is %s; what it records must be shared by every session and survive a crash (%s)", ErrInvalidTable, t.table, what, fix)
	}
	return nil
}

// addCallColumn adds call_id to a fence_tokens made before it: on
// PostgreSQL under CreateIfNotExists's lock, on SQLite (where the lock
// function is unknown) if pragma_table_info does not list it.
func addCallColumn(ctx context.Context, q Querier) error {
	_, err := q.ExecContext(ctx, schemaLock+addCallPG)
	if err == nil || ctx.Err() != nil || sqlState(err) != "" {
		return err
	}
	var n int
	if err := q.QueryRowContext(ctx, hasCallSQLite).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	_, err = q.ExecContext(ctx, addCallSQLite)
	if err != nil && strings.Contains(err.Error(), "duplicate column name") {
		return nil // another process added it meanwhile
	}
	if err != nil && ctx.Err() == nil && errors.Is(retryable(err), ErrRetry) {
		// Another connection's write transaction (a fenced one) outlasted
		// the busy timeout: leave the table as it is, as on PostgreSQL; a
		// later CreateTables adds the column.
		return nil
	}
	return err
}

// CreateIfNotExists runs stmts, statements of the CREATE ... IF NOT EXISTS
// kind, in order, so that processes may run them at once, as workers that
// start together do when each creates the schema it needs. PostgreSQL's
// CREATE TABLE IF NOT EXISTS fails, rather than finds the table, when a
// concurrent one creates it first, and DDL on one table from two sessions
// can deadlock (CREATE INDEX then a FOREIGN KEY to it). So on PostgreSQL
// each string runs as one transaction under a transaction-level advisory
// lock, which every CreateIfNotExists (and CreateTables, and pglock's
// EnsureSchema) takes: their runs on one database go one at a time, and a
// later run finds what an earlier one created. A string may hold several
// statements. In q's own transaction (a *sql.Tx, or a type that wraps one)
// the lock lasts until that transaction ends. Where the lock is unknown
// (SQLite, which runs one writer at a time anyway), the statements run as
// they are. Creators that do not go through CreateIfNotExists are not
// ordered by it: a run that loses a race with one returns PostgreSQL's
// error. Errors are returned as they are; nothing is run twice.
func CreateIfNotExists(ctx context.Context, q Querier, stmts ...string) error {
	if ctx == nil {
		return nilctx.Err("guard", "CreateIfNotExists")
	}
	if err := checkQuerier(q); err != nil {
		return err
	}
	locked := true // PostgreSQL's advisory lock, until an error says there is none
	for _, stmt := range stmts {
		if locked {
			_, err := q.ExecContext(ctx, schemaLock+stmt)
			if err == nil || ctx.Err() != nil || sqlState(err) != "" {
				if err != nil {
					return err
				}
				continue
			}
			locked = false // not PostgreSQL: no such function
		}
		if _, err := q.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// schemaLock serialises CreateIfNotExists's transactions on a PostgreSQL
// database: the two-key advisory lock ("fenc", "sche" as big-endian int4s)
// that pglock's EnsureSchema takes too. Sent in the same simple query as
// the statements (no arguments: pgx's simple protocol), it lasts for their
// implicit transaction.
const schemaLock = "SELECT pg_advisory_xact_lock(1717923427, 1935894629);\n"

// sqlState returns err's SQLSTATE, "" if it has none (not PostgreSQL's).
func sqlState(err error) string {
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		return pg.SQLState()
	}
	return ""
}

// Fence records token as the last accepted token of resource, if it is
// greater than the last one. Inside a transaction it also locks the
// resource's row until the transaction ends, so fenced transactions on one
// resource run one at a time from their fence on: call it first, before
// the reads the transaction decides on, as Tx does. A read made before the
// fence is not ordered by it: a newer holder that read while an older
// holder's fenced transaction was under way waits at its fence for that
// transaction, is then accepted (its token is greater), and acts on what it
// read before the older holder's write (on PostgreSQL at READ COMMITTED:
// two approvals, two charges). It returns a *StaleError (matching ErrStale)
// when the token is not greater; the caller must then roll back. A conflict
// with a concurrent transaction returns an error matching ErrRetry. With q a
// *sql.DB it commits on its own and orders nothing after it: the caller's
// later writes may still land after a newer holder's (see Gate).
//
// If ctx carries a call id (see WithCall), Fence records it with the token,
// and a Fence with the last accepted token and the same call id (a resend
// of a call whose transaction committed) returns a *ReplayedError
// (matching ErrReplayed, not ErrStale): roll back, the work was done. This
// needs fence_tokens' call_id column (see CreateTables). With q a *sql.DB
// (or a *sql.Conn outside a transaction) the fence and its call id commit
// before the caller's work, and stay if the work then fails: a
// *ReplayedError then says only that the call was fenced before, as
// Gate's answer does, not that its work was done.
//
// On PostgreSQL the fence's transaction (with q a *sql.Tx, the caller's
// whole transaction) commits durably even where the session's
// synchronous_commit is off: it is made local for that transaction, so
// that a crash after the commit's reply does not lose the token and let an
// older holder's in (TestFenceSurvivesCrashUnderAsyncCommit). That is one
// WAL flush per fenced commit, as under the default setting. The commit
// follows the setting in force when it runs: turning synchronous_commit
// off after the fence, in the same transaction (SET LOCAL, SET or
// set_config in Tx's fn, or in a function it calls), makes the commit
// asynchronous again, and a crash after its reply can lose the token
// (TestFenceSurvivesCrashAfterSetLocalInFn). A role that may not execute
// set_config (REVOKE EXECUTE … FROM PUBLIC) cannot fence: its permission
// denied is returned, not worked around with a commit that may not be
// durable (TestDurableFormNotDroppedOnPostgreSQL).
func Fence(ctx context.Context, q Querier, resource string, token fence.Token) error {
	if ctx == nil {
		return nilctx.Err("guard", "Fence")
	}
	if err := checkQuerier(q); err != nil {
		return err
	}
	if err := checkResource(resource); err != nil {
		return err
	}
	if err := checkToken(token); err != nil {
		return err
	}
	call := CallFrom(ctx)
	if err := checkCall(call); err != nil {
		return err
	}
	if call != "" {
		return fenceCall(ctx, q, resource, token, call)
	}
	res, err := execDurable(ctx, q, upsertTokenPG, upsertToken, resource, int64(token))
	if err != nil {
		return retryable(fmt.Errorf("guard: fence %q: %w", resource, err))
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	var last int64
	if err := q.QueryRowContext(ctx, selectToken, resource).Scan(&last); err != nil {
		return retryable(fmt.Errorf("guard: fence %q: read last token: %w", resource, err))
	}
	return &StaleError{Resource: resource, Token: token, Last: fence.Token(last)}
}

// fenceCall is Fence with a call id.
func fenceCall(ctx context.Context, q Querier, resource string, token fence.Token, call string) error {
	recorded := strconv.FormatInt(int64(token), 10) + ":" + call
	res, err := execDurable(ctx, q, upsertTokenCallPG, upsertTokenCall, resource, int64(token), recorded)
	if err != nil {
		return retryable(fmt.Errorf("guard: fence %q: %w", resource, noCallColumn(err)))
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	var last int64
	var lastCall sql.NullString
	if err := q.QueryRowContext(ctx, selectTokenCall, resource).Scan(&last, &lastCall); err != nil {
		return retryable(fmt.Errorf("guard: fence %q: read last token: %w", resource, noCallColumn(err)))
	}
	if last == int64(token) && lastCall.Valid && lastCall.String == recorded {
		return &ReplayedError{Resource: resource, Token: token, Call: call}
	}
	return &StaleError{Resource: resource, Token: token, Last: fence.Token(last)}
}

// execDurable runs a statement that records a token in its PostgreSQL
// form, pg, which commits durably (see pgdurable.Commit), or in its plain form
// where set_config is unknown (SQLite, which refuses pg before running any
// of it). It knows SQLite's refusal by its own words: any other error
// naming set_config (PostgreSQL's permission denied, flattened by a
// wrapper with pg's text in it) is returned, not taken for SQLite's
// (TestDurableFormNotDroppedOnPostgreSQL). The plain form is sent even if
// ctx has ended since the refusal: database/sql then returns ctx's error
// without running it, and the caller learns that ctx ended, not of
// SQLite's refusal (TestCancelAfterDurableFormRefused).
func execDurable(ctx context.Context, q Querier, pg, plain string, args ...any) (sql.Result, error) {
	res, err := q.ExecContext(ctx, pg, args...)
	if err != nil && pg != plain && strings.Contains(err.Error(), "no such function: set_config") {
		return q.ExecContext(ctx, plain, args...)
	}
	return res, err
}

// noCallColumn says what to do when err is fence_tokens lacking call_id (a
// table made before call ids, CreateTables not run since).
func noCallColumn(err error) error {
	msg := err.Error()
	if strings.Contains(msg, "call_id") && (sqlState(err) == "42703" || strings.Contains(msg, "no such column") || strings.Contains(msg, "has no column")) {
		return &noCallColumnError{err}
	}
	return err
}

// noCallColumnError is fence_tokens lacking call_id; SQLStore then fences
// the request without its call id.
type noCallColumnError struct{ err error }

func (e *noCallColumnError) Error() string {
	return e.err.Error() + " (fence_tokens has no call_id column: run guard.CreateTables, or ALTER TABLE fence_tokens ADD COLUMN call_id TEXT)"
}

func (e *noCallColumnError) Unwrap() error { return e.err }

// Tx runs fn inside a transaction fenced on resource with token: Fence runs
// first, then fn, then the commit. resource must be one name per protected
// thing: a name built from a key as the client spelled it ("PAY-ABC",
// "pay-abc") names two resources, each with its own last token, for the
// one row that a case-insensitive collation finds for both (tested: a
// stale token wrote); build it from the key as the database stores it, or
// keep the token in the row with Table.Update. It is the way to do a fenced
// read-modify-write: fn reads what it decides on through tx, after the
// fence, and writes through tx (see the package documentation). Given the
// ctx of a handler that SQLStore runs and that store's DB, it returns
// ErrNestedTx at once (see SQLStore).
//
// If the token is stale, fn is not called and Tx returns a *StaleError
// (matching ErrStale); if it is a resend of the call that committed the
// token (ctx's call id, see WithCall and Fence), fn is not called and Tx
// returns a *ReplayedError (matching ErrReplayed). If fn returns an error, Tx rolls back and returns it.
// If fn panics, Tx rolls back, releasing the resource's row lock, and the
// panic goes on. A conflict with a concurrent transaction (a serialization
// failure or deadlock on PostgreSQL, SQLITE_BUSY on SQLite) returns an
// error matching ErrRetry. A cancelled ctx rolls the transaction back
// (database/sql), unless it ends while the commit is under way: an error
// from the commit other than ErrRetry (a deadline, a lost connection)
// leaves the outcome unknown, and the token and fn's writes may have been
// committed (seen with a PostgreSQL backend stopped before the commit and
// resumed after the deadline). Retry as after ErrRetry, reading again
// under a new lease; never replay the writes as if nothing was written.
// fn must use tx, not db: work done through db is not part
// of the fenced transaction, and with a pool of one connection it waits
// until ctx ends. fn must not commit or roll back tx itself, neither
// through tx's methods (Tx then fails: with sql.ErrTxDone, or on SQLite
// with the commit refused, or the rollback seen, by the hooks described
// below) nor with SQL of its own (COMMIT, ROLLBACK, a script that
// contains them): on PostgreSQL the statements after it run outside any
// transaction, unfenced, and Tx reports success, the fence committed
// early or rolled back (on SQLite the hooks refuse them, and Tx fails). On SQLite a
// failed statement may end the whole transaction by itself: a write whose
// own context ends (modernc.org/sqlite interrupts it), a trigger's
// RAISE(ROLLBACK), INSERT OR ROLLBACK, an ON CONFLICT ROLLBACK constraint,
// SQLITE_FULL, SQLITE_IOERR or SQLITE_NOMEM. The fence is rolled back with
// it and the write lock released, but tx stays open for database/sql, and
// each later statement through it would run and commit on its own,
// unfenced, after a newer holder's writes perhaps (tested: a stale
// holder's write landed after the newer one's). So on a driver whose
// connections offer RegisterCommitHook and RegisterRollbackHook
// (modernc.org/sqlite and mattn/go-sqlite3 do), Tx runs on a connection of
// its own with a commit hook that refuses every commit but its own while
// fn runs, and a rollback hook that sees the fenced transaction end: such
// a statement fails, having written nothing, and Tx commits nothing after
// such a rollback (not even a transaction fn opened since, with SAVEPOINT
// or BEGIN) and fails, saying so. The hooks are set once on each
// connection a Tx runs on, and stay there, doing nothing between Txs: they
// replace for good those the application registered on it, and hooks the
// application registers on it afterwards take Tx's protection away there.
// A pool whose connections do not show the methods (a tracing wrapper's)
// gets no hooks. Either way, when a statement in fn fails, return its error rather
// than write on. (PostgreSQL refuses the statements after a failed one.)
func Tx(ctx context.Context, db *sql.DB, resource string, token fence.Token, fn func(tx *sql.Tx) error) error {
	if ctx == nil {
		return nilctx.Err("guard", "Tx")
	}
	if db == nil || fn == nil {
		return fmt.Errorf("%w: guard: Tx with a nil db or fn", fence.ErrInvalidOption)
	}
	if err := checkResource(resource); err != nil {
		return err
	}
	if err := checkToken(token); err != nil {
		return err
	}
	if in, ok := ctx.Value(txKey{}).(storeTx); ok && in.db == db {
		return fmt.Errorf("%w: fence %q with Fence on TxFrom's transaction", ErrNestedTx, resource)
	}
	tx, gate, end, err := begin(ctx, db)
	if err != nil {
		return retryable(fmt.Errorf("guard: begin: %w", err))
	}
	defer end() // after the rollback below
	// If fn panics (or calls runtime.Goexit), end the transaction so that
	// the row lock taken by Fence does not outlive it. After a commit or
	// rollback this does nothing.
	defer func() { _ = tx.Rollback() }()
	err = Fence(ctx, tx, resource, token)
	if err == nil {
		err = fn(tx)
	}
	if err == nil {
		if err = gate.over(); err != nil && ctx.Err() != nil {
			// database/sql rolled tx back when ctx ended: say so, as
			// tx.Commit would (TestTxDeadlineInFnOnSQLite).
			err = errors.Join(ctx.Err(), err)
		}
	}
	if err != nil {
		return retryable(errors.Join(err, rollback(tx), gate.refusals()))
	}
	if gate != nil {
		gate.allow.Store(true)
	}
	if err := tx.Commit(); err != nil {
		if refused := gate.refusals(); refused != nil {
			return fmt.Errorf("guard: commit: %w (%w)", err, refused)
		}
		return retryable(fmt.Errorf("guard: commit: %w", err))
	}
	return nil
}

func rollback(tx *sql.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("guard: rollback: %w", err)
	}
	return nil
}

// Once records an idempotency key, normally inside the transaction that does
// the work. It returns ErrDuplicate if the key was recorded before: the work
// was already done, and the caller should roll back and report success. A
// conflict with a concurrent transaction (at REPEATABLE READ or
// SERIALIZABLE, one that recorded the same key) returns an error matching
// ErrRetry. A key that is empty, over 512 bytes, not valid UTF-8 or holds
// a NUL byte returns an error matching ErrInvalidKey, and nothing is sent.
// On PostgreSQL the key commits durably even where synchronous_commit is
// off, as a fence does (see Fence).
func Once(ctx context.Context, q Querier, key string) error {
	if ctx == nil {
		return nilctx.Err("guard", "Once")
	}
	if err := checkQuerier(q); err != nil {
		return err
	}
	if key == "" || len(key) > maxIdemKeyBytes {
		return fmt.Errorf("%w: %d bytes, want 1 to %d", ErrInvalidKey, len(key), maxIdemKeyBytes)
	}
	if !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0 {
		// PostgreSQL's text refuses both (22021) and SQLite stores them:
		// refused here, so that a key means the same on both.
		return fmt.Errorf("%w: %q is not UTF-8 without NUL bytes", ErrInvalidKey, key)
	}
	res, err := execDurable(ctx, q, insertIdemKeyPG, insertIdemKey, key)
	if err != nil {
		return retryable(fmt.Errorf("guard: record idempotency key: %w", err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: %q", ErrDuplicate, key)
	}
	return nil
}

// Table describes a business table for conditional updates: the table, its
// key column and the column compared (the last accepted token for Update,
// the row version for UpdateVersion). The names are plain SQL identifiers
// (letters, digits, underscores, optionally schema-qualified).
type Table struct {
	Name   string // e.g. "payment"
	Key    string // e.g. "id"
	Column string // e.g. "last_fencing_token" or "version"

	// Observer, if not nil, is told of every token Update accepted or
	// rejected as stale, with the resource "<Name> <key>" (UpdateVersion
	// checks versions, not tokens, and reports nothing). One holding a
	// nil pointer makes Update return an error matching
	// fence.ErrInvalidOption, having run nothing.
	Observer fence.Observer
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

func (t Table) check(set string) error {
	for _, id := range []string{t.Name, t.Key, t.Column} {
		if !identifier.MatchString(id) {
			return fmt.Errorf("%w: %q is not a plain SQL identifier", ErrInvalidTable, id)
		}
	}
	// The WHERE clause that fences the update comes after set: a comment
	// would swallow it, a ';' end the statement before it. PostgreSQL then
	// fails for want of $1 and $2, but SQLite ignores unused arguments and
	// runs the rest, unfenced, on every row.
	for _, bad := range []string{"--", "/*", ";"} {
		if strings.Contains(set, bad) {
			return fmt.Errorf("%w: set %q holds %q, which would cut off the update's WHERE clause; pass such text as an argument", ErrInvalidTable, set, bad)
		}
	}
	if err := fence.ValidateObserver(t.Observer); err != nil {
		// It would panic after the update, inside the caller's
		// transaction.
		return fmt.Errorf("guard: Table.%w", err)
	}
	return nil
}

// Update runs the conditional update (see the package doc) on the row whose
// key is key:
//
//	UPDATE <Name> SET <set>, <Column> = $2 WHERE <Key> = $1 AND (<Column> - $2 < 0 OR <Column> IS NULL)
//
// (the difference, not <Column> < $2, so that SQLite compares numbers even
// where the column was declared TEXT). On PostgreSQL it commits durably
// even where synchronous_commit is off, as Fence does (see Fence). Column
// should be a BIGINT (INTEGER on SQLite): on PostgreSQL an INTEGER or TEXT
// column cannot take the token (an error), and a REAL one rounds it, so
// that newer tokens within its precision are refused with an error.
//
// set assigns the business columns with placeholders from $3 on, filled by
// args. It must not hold a comment (-- or /*) or a ';', which would cut
// off the WHERE clause (on SQLite the update then ran on every row,
// unfenced): Update then returns ErrInvalidTable and runs nothing; pass
// such text as an argument. When no row changes, Update reads the row to
// tell why: a *StaleError (matching ErrStale) with the row's token, or ErrNoRow (also
// when the row read holds an older token than the caller's, or NULL: it
// was inserted by another session after the update found nothing). A
// NULL in Column means the row was never fenced (as 0 does): a column
// added to a table with rows is NULL until each row's first fenced write.
//
// Update orders writers, but it does not check what the caller read before:
// a stale worker that writes first is accepted. For a read-modify-write,
// read and write inside Tx, or put the precondition read into set's WHERE
// through a statement of your own (see the package documentation).
//
// A conflict with a concurrent transaction (a serialization failure or
// deadlock on PostgreSQL, SQLITE_BUSY on SQLite) returns an error matching
// ErrRetry, as UpdateVersion's does: nothing was written.
func (t Table) Update(ctx context.Context, q Querier, key any, token fence.Token, set string, args ...any) error {
	if ctx == nil {
		return nilctx.Err("guard", "Table.Update")
	}
	if err := checkQuerier(q); err != nil {
		return err
	}
	if err := t.check(set); err != nil {
		return err
	}
	if err := checkToken(token); err != nil {
		return err
	}
	// "Column - $2 < 0", not "Column < $2": SQLite compares a column of
	// TEXT affinity (TEXT, VARCHAR) with a number as text, and accepted
	// token 9 after 1800000000000003 ('1' < '9'); a difference is always
	// computed on numbers. PostgreSQL infers $2's type from the column in
	// both forms.
	stmt := fmt.Sprintf("UPDATE %s SET %s, %s = $2 WHERE %s = $1 AND (%s - $2 < 0 OR %s IS NULL)", t.Name, set, t.Column, t.Key, t.Column, t.Column)
	// On PostgreSQL the update commits durably, as a fence does: lost in
	// a crash after its reply, it took the newer token with it, and an
	// older one was accepted (TestFenceSurvivesCrashUnderAsyncCommit).
	changed, current, err := t.exec(ctx, q, stmt+" AND "+pgdurable.Commit, stmt, key, int64(token), args)
	switch {
	case err != nil:
		return err
	case changed:
		t.decided(key, token, fence.GuardAccept)
		return nil
	case !current.Valid || current.Int64 < int64(token):
		// The update would have matched this row: it was not there when
		// the update ran, and another session inserted it since.
		return t.noRow(key)
	}
	t.decided(key, token, fence.GuardReject)
	return &StaleError{Resource: fmt.Sprintf("%s %v", t.Name, key), Token: token, Last: fence.Token(current.Int64)}
}

// decided tells the Observer, if any, of Update's decision on token.
func (t Table) decided(key any, token fence.Token, d fence.GuardDecision) {
	if t.Observer != nil {
		t.Observer.GuardDecided(fence.GuardEvent{Resource: fmt.Sprintf("%s %v", t.Name, key), Token: token, Decision: d})
	}
}

// UpdateVersion runs an optimistic update on the row whose key is key, if
// its version column still holds version, and increments it:
//
//	UPDATE <Name> SET <set>, <Column> = <Column> + 1 WHERE <Key> = $1 AND <Column> = $2
//
// set follows Update's rules. When no row changes it returns a
// *ConflictError (matching ErrConflict) with the row's version, or ErrNoRow
// (also when the row read afterwards holds the version expected: it was
// inserted after the update found nothing).
func (t Table) UpdateVersion(ctx context.Context, q Querier, key any, version int64, set string, args ...any) error {
	if ctx == nil {
		return nilctx.Err("guard", "Table.UpdateVersion")
	}
	if err := checkQuerier(q); err != nil {
		return err
	}
	if err := t.check(set); err != nil {
		return err
	}
	stmt := fmt.Sprintf("UPDATE %s SET %s, %s = %s + 1 WHERE %s = $1 AND %s = $2", t.Name, set, t.Column, t.Column, t.Key, t.Column)
	changed, current, err := t.exec(ctx, q, stmt, stmt, key, version, args)
	switch {
	case err != nil || changed:
		return err
	case !current.Valid:
		return fmt.Errorf("guard: update %s %v: its %s is NULL, not a version", t.Name, key, t.Column)
	case current.Int64 == version:
		// Not there when the update ran; inserted since.
		return t.noRow(key)
	}
	return &ConflictError{Key: key, Expected: version, Current: current.Int64}
}

// exec runs a conditional update, pg on PostgreSQL and plain elsewhere
// (see execDurable); when it changed no row, it returns the row's current
// Column value (read after the update, so that a row inserted meanwhile
// may be there now), or ErrNoRow.
func (t Table) exec(ctx context.Context, q Querier, pg, plain string, key any, cond int64, args []any) (changed bool, current sql.NullInt64, err error) {
	res, err := execDurable(ctx, q, pg, plain, append([]any{key, cond}, args...)...)
	if err != nil {
		return false, current, retryable(fmt.Errorf("guard: update %s: %w", t.Name, err))
	}
	n, err := res.RowsAffected()
	if err != nil || n > 0 {
		return n > 0, current, err
	}
	sel := fmt.Sprintf("SELECT %s FROM %s WHERE %s = $1", t.Column, t.Name, t.Key)
	err = q.QueryRowContext(ctx, sel, key).Scan(&current)
	if errors.Is(err, sql.ErrNoRows) {
		return false, current, t.noRow(key)
	}
	if err != nil {
		return false, current, retryable(fmt.Errorf("guard: read %s %v: %w", t.Name, key, err))
	}
	return false, current, nil
}

func (t Table) noRow(key any) error { return fmt.Errorf("%w: %s %v", ErrNoRow, t.Name, key) }

// checkQuerier refuses a nil Querier (or a nil *sql.DB, *sql.Tx or
// *sql.Conn in one), which panicked with a nil pointer dereference: inside
// an HTTP handler, a SQLStore without its DB took the request down with it.
func checkQuerier(q Querier) error {
	switch q := q.(type) {
	case nil:
	case *sql.DB:
		if q != nil {
			return nil
		}
	case *sql.Tx:
		if q != nil {
			return nil
		}
	case *sql.Conn:
		if q != nil {
			return nil
		}
	default:
		return nil
	}
	return fmt.Errorf("%w: guard: nil database (Querier %T)", fence.ErrInvalidOption, q)
}
