package pglock

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/fencekit/fence/internal/pause"
)

// DefaultWatchdogTTL is the lease time of leases acquired without fence.TTL
// when Options.WatchdogTTL is zero, as in redislock.
const DefaultWatchdogTTL = 30 * time.Second

// ErrTokensExhausted is wrapped by the error of an Acquire that failed
// because the token sequence has reached its maximum: no token can be issued
// again (the sequence never cycles), so the lock cannot be granted until an
// operator intervenes. Acquire does not retry it within its Wait budget.
var ErrTokensExhausted = errors.New("pglock: token sequence exhausted")

// errLateReply is in the error of a try that took the lock but whose reply
// came after the lease's deadline: it gives no lease (see try).
var errLateReply = fmt.Errorf("%w: the reply that took the lock came too late", errGivenBack)

// errUnsignalled is in the error of a try that took the lock while the
// signal to the stalled backends of earlier tries could not be sent (the
// Acquire's ctx ended, the statement failed): it gives no lease (see try).
var errUnsignalled = fmt.Errorf("%w: the stalled backends of earlier tries could not be signalled", errGivenBack)

// errGivenBack is in the errors of tries that took the lock and gave it
// back: errLateReply, errUnsignalled.
var errGivenBack = fmt.Errorf("%w: taken and given back", fence.ErrLeaseLost) // matches fence.ErrLeaseLost: the lease ended before Acquire returned

// DefaultTable is the lease table's name when Options.Table is empty.
const DefaultTable = "fence_leases"

// Options configure a Locker. A nil *Options means the defaults.
type Options struct {
	// Table is the lease table; the token sequence is Table + "_token" and
	// the NOTIFY channel is Table. Default DefaultTable. See ValidateTable.
	Table string

	// WatchdogTTL is the lease time of leases acquired without fence.TTL;
	// their watchdog renews them every third of it. Zero means
	// DefaultWatchdogTTL.
	WatchdogTTL time.Duration

	// Listener delivers the notifications a release sends, so that a
	// waiter wakes when the lock is released. Without one, a waiter wakes
	// only when the holder's lease expires by the database's clock, so a
	// released lock is taken up to a lease time late.
	Listener Listener

	// Observer, if not nil, is told of every acquisition and the end of
	// every lease, with Backend "postgres"; see fence.Observer.
	Observer fence.Observer

	// Logger, if not nil, receives a warning when a lease is lost (with
	// the lock name, token and cause) and when a watchdog renewal fails.
	// Nil logs nothing. Credentials never appear in it: the lines carry
	// names, tokens, causes and errors (database/sql's errors do not
	// carry the DSN).
	Logger *slog.Logger

	_ struct{}
}

// Listener subscribes to PostgreSQL notifications. database/sql has no
// LISTEN, so the caller provides one on a driver that has (pgx's
// WaitForNotification, lib/pq's Listener); see the package doc. A Locker
// calls Listen once while any of its Acquires waits, whatever the lock's
// name, and shares the notifications among them.
type Listener interface {
	// Listen runs LISTEN channel on a connection of its own and returns
	// once the server has confirmed it, so that no notification sent after
	// Listen returns is missed. It sends the payload of each notification
	// on the returned channel, which it closes when it stops listening:
	// when ctx ends, or when the connection fails. The Locker cancels ctx
	// and then reads the channel until it is closed.
	Listen(ctx context.Context, channel string) (<-chan string, error)
}

// Locker is a fence.Locker on PostgreSQL. It is safe for concurrent use.
type Locker struct {
	db       *sql.DB
	table    string
	watchdog time.Duration
	listener Listener
	q        queries
	obs      fence.Observer // nil: none
	log      *slog.Logger   // nil: none

	mu  sync.Mutex
	sub *subscription // the waiters' shared LISTEN; nil when nobody waits
}

var _ fence.Locker = (*Locker)(nil)

// New returns a Locker that keeps its leases in db, with the options o,
// which may be nil. The table and sequence must exist: see EnsureSchema and
// Schema. It returns an error matching fence.ErrInvalidOption if the table
// name is invalid (an *InvalidTableError) or WatchdogTTL is out of range;
// New sends nothing to the database.
func New(db *sql.DB, o *Options) (*Locker, error) {
	if db == nil {
		return nil, fmt.Errorf("pglock: %w: nil *sql.DB", fence.ErrInvalidOption)
	}
	if o == nil {
		o = &Options{}
	}
	l := &Locker{db: db, table: cmp.Or(o.Table, DefaultTable), watchdog: DefaultWatchdogTTL, listener: o.Listener, obs: o.Observer, log: o.Logger}
	if err := ValidateTable(l.table); err != nil {
		return nil, err
	}
	if err := fence.ValidateObserver(o.Observer); err != nil {
		return nil, fmt.Errorf("pglock: %w", err)
	}
	if o.WatchdogTTL != 0 {
		if err := fence.ValidateTTL(o.WatchdogTTL); err != nil {
			return nil, fmt.Errorf("pglock: watchdog TTL: %w", err)
		}
		l.watchdog = o.WatchdogTTL
	}
	l.q = newQueries(l.table)
	return l, nil
}

// EnsureSchema creates the lease table and the token sequence if they do
// not exist (the statements of Schema; when both exist it creates nothing,
// so a role that may use them but not create in their schema may call
// it), then checks them: a name held by a
// relation of another kind (another Locker's sequence, whose Table is this
// one's less "_token", or its table), or a table without the lease
// columns or with token or expires_at of another type than Schema's (a
// timestamp without time zone, read in each session's TimeZone, lets two
// sessions in different zones hold the lock at once), or with a name or
// owner column that cannot hold every name or owner as given (char(n),
// citext, a case-insensitive collation: two names one lock; see
// checkColumnTypes), or an unlogged
// table (a crash empties it), is an error matching fence.ErrInvalidOption. Processes may call it at once: the
// statements run in one transaction under a transaction-level advisory lock
// (PostgreSQL's CREATE ... IF NOT EXISTS fails, rather than finds the
// object, when a concurrent one creates it first).
func (l *Locker) EnsureSchema(ctx context.Context) error {
	if ctx == nil {
		return nilctx.Err("pglock", "EnsureSchema")
	}
	if err := l.made(); err != nil {
		return err
	}
	schema, err := Schema(l.table) // valid: New checked it
	if err != nil {
		return err
	}
	// In place already (a migration made them): nothing to create, and
	// no right to create needed (CREATE ... IF NOT EXISTS checks it before
	// it looks for the object).
	if missing, err := l.checkSchema(ctx); err != nil || !missing {
		return err
	}
	// One simple query: its statements are one implicit transaction, which
	// the lock lasts for.
	if _, err := l.db.ExecContext(ctx, schemaLock+schema); err != nil {
		return fmt.Errorf("pglock: create schema: %w", err)
	}
	if missing, err := l.checkSchema(ctx); err != nil {
		return err
	} else if missing {
		return fmt.Errorf("pglock: create schema: table %q or its sequence is missing after its creation", l.table)
	}
	return nil
}

// checkSchema checks that the lease table and the token sequence are what
// Schema creates: IF NOT EXISTS skips a name that a relation of another
// kind holds (the table of a Locker whose Table is this one's plus
// "_token", that Locker's sequence, a table of the application's), which
// no Acquire could use. The error matches fence.ErrInvalidOption. missing
// reports that the table or the sequence does not exist (the other, if it
// does, being right).
func (l *Locker) checkSchema(ctx context.Context) (missing bool, _ error) {
	var table, persistence, seq sql.NullString
	err := l.db.QueryRowContext(ctx, `SELECT
  (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)),
  (SELECT relpersistence::text FROM pg_class WHERE oid = to_regclass($1)),
  (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($2))`,
		`"`+l.table+`"`, `"`+l.table+`_token"`).Scan(&table, &persistence, &seq)
	if err != nil {
		return false, fmt.Errorf("pglock: check schema: %w", err)
	}
	if table.Valid && table.String != "r" && table.String != "p" {
		return false, fmt.Errorf("pglock: %w: %q is not a table (relkind %q): another Locker's token sequence? Choose another Table", fence.ErrInvalidOption, l.table, table.String)
	}
	if persistence.Valid && persistence.String != "p" {
		// Unlogged (or temporary): emptied by the recovery after a
		// crash, with the leases held then (TestUnloggedLeaseTableRefused).
		return false, fmt.Errorf("pglock: %w: table %q is not a permanent, logged table (relpersistence %q): a crash would empty it of the leases held; ALTER TABLE ... SET LOGGED", fence.ErrInvalidOption, l.table, persistence.String)
	}
	if seq.Valid && seq.String != "S" {
		return false, fmt.Errorf("pglock: %w: %q, the token sequence of table %q, is not a sequence (relkind %q): another Locker's table? Choose another Table", fence.ErrInvalidOption, l.table+"_token", l.table, seq.String)
	}
	if !table.Valid {
		return true, nil
	}
	_, err = l.db.ExecContext(ctx, fmt.Sprintf(`SELECT name, owner, token, expires_at FROM "%s" LIMIT 0`, l.table))
	if isSQLState(err, "42703") { // undefined_column
		return false, fmt.Errorf("pglock: %w: table %q exists and is not a lease table: %w", fence.ErrInvalidOption, l.table, err)
	} else if err != nil {
		return false, fmt.Errorf("pglock: check schema: %w", err)
	}
	if err := l.checkColumnTypes(ctx); err != nil {
		return false, err
	}
	return !seq.Valid, nil
}

// checkColumnTypes checks the types of the lease table's columns, which a
// table written by hand may have wrong with the right names: a timestamp
// without time zone is written and read in each session's TimeZone (a
// session five hours behind the holder's finds its row expired: two
// holders), a timestamptz of less than millisecond precision rounds the
// expiry up to half a second before the holder's Deadline, and a token
// narrower than bigint cannot hold a token floored by the clock in
// microseconds (every Acquire fails). A name column that does not hold
// every name as given makes two names one lock, or a name no lock: char(n)
// pads and compares without the padding ("x" and "x "), the type name cuts
// at 63 bytes, citext or a nondeterministic collation compares without
// case ("x" and "X"), and a varchar(n) shorter than fence.MaxNameLen cuts
// a name's trailing spaces to fit, after which its row never matches it
// and Acquire creates it again until its ctx ends. An owner column that
// cannot hold an owner (32 hex digits) or the free row's empty one
// (varchar(16), uuid) fails every Acquire
// (TestLeaseTableOfWrongNameOrOwnerTypes). The error matches
// fence.ErrInvalidOption.
func (l *Locker) checkColumnTypes(ctx context.Context) error {
	var token, expires, name, owner string
	var tokenOK, expiresOK, nameOK, ownerOK bool
	// base and mod are those of the type a domain is over; a varchar's or
	// a char's mod is its length plus 4.
	err := l.db.QueryRowContext(ctx, `SELECT
  max(format_type(atttypid, atttypmod)) FILTER (WHERE attname = 'token'),
  coalesce(bool_or(atttypid = 'bigint'::regtype) FILTER (WHERE attname = 'token'), false),
  max(format_type(atttypid, atttypmod)) FILTER (WHERE attname = 'expires_at'),
  coalesce(bool_or(atttypid = 'timestamptz'::regtype AND (atttypmod < 0 OR atttypmod >= 3)) FILTER (WHERE attname = 'expires_at'), false),
  max(format_type(atttypid, atttypmod) || CASE WHEN det THEN '' ELSE ' COLLATE ' || coll END) FILTER (WHERE attname = 'name'),
  coalesce(bool_or(base IN ('text'::regtype, 'varchar'::regtype) AND (mod < 0 OR mod - 4 >= $2) AND det) FILTER (WHERE attname = 'name'), false),
  max(format_type(atttypid, atttypmod)) FILTER (WHERE attname = 'owner'),
  coalesce(bool_or(base IN ('text'::regtype, 'varchar'::regtype, 'bpchar'::regtype) AND (mod < 0 OR mod - 4 >= $3)) FILTER (WHERE attname = 'owner'), false)
FROM (SELECT attname, atttypid, atttypmod,
    CASE typtype WHEN 'd' THEN typbasetype ELSE atttypid END AS base,
    CASE typtype WHEN 'd' THEN typtypmod ELSE atttypmod END AS mod,
    coalesce(collisdeterministic, true) AS det, quote_ident(collname) AS coll
  FROM pg_attribute JOIN pg_type ON pg_type.oid = atttypid LEFT JOIN pg_collation ON pg_collation.oid = attcollation
  WHERE attrelid = to_regclass($1) AND attname IN ('token', 'expires_at', 'name', 'owner') AND NOT attisdropped) c`,
		`"`+l.table+`"`, fence.MaxNameLen, ownerLen).Scan(&token, &tokenOK, &expires, &expiresOK, &name, &nameOK, &owner, &ownerOK)
	if err != nil {
		return fmt.Errorf("pglock: check schema: %w", err)
	}
	if !tokenOK {
		return fmt.Errorf("pglock: %w: table %q: token is %s, want bigint (see Schema)", fence.ErrInvalidOption, l.table, token)
	}
	if !expiresOK {
		return fmt.Errorf("pglock: %w: table %q: expires_at is %s, want timestamp with time zone of millisecond precision or finer (see Schema): a timestamp without time zone is read in each session's TimeZone, and a coarser one rounds the expiry before the holder's deadline", fence.ErrInvalidOption, l.table, expires)
	}
	if !nameOK {
		return fmt.Errorf("pglock: %w: table %q: name is %s, want text (see Schema), or varchar of at least %d characters, with a deterministic collation: lock names are compared as bytes, and a type that pads, cuts or folds them makes two names one lock, or a name no lock", fence.ErrInvalidOption, l.table, name, fence.MaxNameLen)
	}
	if !ownerOK {
		return fmt.Errorf("pglock: %w: table %q: owner is %s, want text (see Schema), or varchar or char of at least %d characters: every Acquire writes an owner of %d hex digits, or the empty one of a free row", fence.ErrInvalidOption, l.table, owner, ownerLen, ownerLen)
	}
	return nil
}

// schemaLock serialises EnsureSchema's transactions on a database: the
// two-key advisory lock ("fenc", "sche" as big-endian int4s).
const schemaLock = "SELECT pg_advisory_xact_lock(1717923427, 1935894629);\n"

// Acquire takes the lock called name; see fence.Locker. Whether the lock
// is free is judged by the database's clock. With a Wait budget, every
// try ends with the budget (a statement blocked on the row's lock by a
// transaction left open on it), the first one a second after the start at
// the soonest (cut while blocked on the row, it reports the lock held; cut
// while connecting, it reports the failure, not ErrHeld); a waiter
// sends no query while the holder's lease lives: it waits for the release's
// notification (with a Listener) or for the holder's expiry, computed by
// the database, and then tries again. Backend errors while waiting are
// retried with a back-off until the budget ends; the error then wraps the
// last one. A token sequence at its maximum is not retried: the error wraps
// ErrTokensExhausted at once. Nor is a name that the database's encoding
// cannot store (a LATIN1 database, a client sending UTF-8): the error
// matches fence.ErrInvalidName. A try that took the lock but whose reply
// came after the lease's deadline (a stalled backend) gives no lease: the
// row is given back (owner-checked) and the wait goes on with a new owner,
// or, with no budget left, the error says the reply came too late.
func (l *Locker) Acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	if ctx == nil {
		return nil, nilctx.Err("pglock", "Acquire")
	}
	if l == nil || l.obs == nil {
		return l.acquire(ctx, name, opts...)
	}
	start := time.Now()
	lease, err := l.acquire(ctx, name, opts...)
	fence.ReportAcquire(l.obs, backend, name, start, lease, err)
	return lease, err
}

// backend is the Backend of the events this package reports.
const backend = "postgres"

func (l *Locker) acquire(ctx context.Context, name string, opts ...fence.Option) (fence.Lease, error) {
	if err := l.made(); err != nil {
		return nil, err
	}
	if err := fence.ValidateName(name); err != nil {
		return nil, err
	}
	o, err := fence.Apply(opts)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fence.NotAcquired(name, err)
	}
	start := time.Now()
	a := attempt{name: name, owner: newOwner(), ttl: o.TTL}
	if a.ttl == 0 {
		a.ttl, a.watchdog = l.watchdog, true
	}
	// With a Wait budget, the first try is part of the wait: a statement
	// blocked on the row's lock (a transaction left open on it) ends with
	// the budget, not only with ctx; but it is given firstTryMin at least,
	// so that a budget shorter than a round trip (or a dial) still tries.
	tryCtx := ctx
	if o.Wait > 0 {
		var cancel context.CancelFunc
		tryCtx, cancel = context.WithDeadline(ctx, start.Add(max(o.Wait, firstTryMin)))
		defer cancel()
	}
	lease, left, err := l.try(tryCtx, &a)
	switch {
	case lease != nil:
		return lease, nil
	case err != nil && (o.Wait == 0 || permanent(err)):
		l.giveUp(&a)
		return nil, fence.NotAcquired(name, closedDB(err))
	case err == nil && o.Wait == 0:
		return nil, fence.NotAcquired(name, fence.ErrHeld)
	case err != nil && tryCtx.Err() != nil && !errors.Is(err, errGivenBack):
		// The budget ended during the first try, which failed for that
		// reason (see the loop's tries below).
		l.giveUp(&a)
		if ctx.Err() != nil {
			return nil, fence.NotAcquired(name, ctx.Err())
		}
		if a.noConn {
			// Cut while connecting: the database never answered, and
			// nothing is known of the lock. Not ErrHeld (an outage
			// counted as contention), nor the deadline's error (the
			// caller's ctx has not ended).
			return nil, fence.NotAcquired(name, fmt.Errorf("%v (no connection within the first try's %v)", err, max(o.Wait, firstTryMin)))
		}
		return nil, fence.NotAcquired(name, fence.ErrHeld)
	}

	waitCtx, cancel := context.WithDeadline(ctx, start.Add(o.Wait))
	defer cancel()
	var (
		sub      *subscription // nil until listening
		w        *waiter
		failures int
		breaks   int // listeners that stopped in a row, no notification between
		lastErr  = err
	)
	// budgetEnded is Acquire's error when waitCtx ended; before is the
	// error of the last try that the end did not cut short.
	budgetEnded := func(before error) error {
		l.giveUp(&a)
		switch {
		case ctx.Err() != nil:
			return fence.NotAcquired(name, ctx.Err())
		case before != nil:
			return fence.NotAcquired(name, before)
		default:
			return fence.NotAcquired(name, fence.ErrHeld)
		}
	}
	defer func() {
		if sub != nil {
			l.leave(sub, w)
		}
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if sub == nil && l.listener != nil && lastErr == nil {
			// Listen before the next try, so that a release between the
			// try and the wait is not missed.
			if s, jw, err := l.join(waitCtx, name); err != nil {
				if waitCtx.Err() != nil {
					// The budget ended while the Listener started: the
					// lock is as the last try found it, held.
					return nil, budgetEnded(nil)
				}
				lastErr = err
			} else {
				sub, w = s, jw
				left = 0 // try again now that we listen
			}
		}
		var next time.Duration
		if lastErr != nil {
			failures++
			next = pause.Backoff(failures)
		} else {
			failures = 0
			next = left
		}
		if next > 0 {
			var wake <-chan struct{}
			var broken <-chan struct{}
			if sub != nil {
				wake, broken = w.wake, sub.broken
			}
			timer.Reset(next)
			select {
			case <-wake:
				breaks = 0
			case <-broken:
				// The listener stopped: listen again, after a back-off
				// that grows while listeners keep stopping at once, so
				// that one a proxy keeps cutting is not a hot loop of
				// LISTENs and tries.
				l.leave(sub, w)
				sub, w = nil, nil
				breaks++
				timer.Stop()
				timer.Reset(pause.Backoff(breaks))
				select {
				case <-timer.C:
				case <-waitCtx.Done():
					return nil, budgetEnded(lastErr)
				}
			case <-timer.C:
			case <-waitCtx.Done():
				return nil, budgetEnded(lastErr)
			}
			timer.Stop()
		}
		before := lastErr
		lease, left, lastErr = l.try(waitCtx, &a)
		if lease != nil {
			return lease, nil
		}
		if lastErr != nil && waitCtx.Err() != nil && !errors.Is(lastErr, errGivenBack) {
			// The budget ended during this try, which failed for that
			// reason: the lock was as before, held or unreachable.
			return nil, budgetEnded(before)
		}
		if permanent(lastErr) {
			l.giveUp(&a)
			return nil, fence.NotAcquired(name, closedDB(lastErr))
		}
	}
}

// permanent reports whether a try's error is one that Acquire does not
// retry within its Wait budget: no token can be issued, the *sql.DB was
// closed, or the database cannot store the name.
func permanent(err error) bool {
	return errors.Is(err, ErrTokensExhausted) || errors.Is(err, errDBClosed) || errors.Is(err, fence.ErrInvalidName)
}

// errDBClosed is database/sql's (unexported) error for a call on a closed
// *sql.DB, taken from one.
var errDBClosed = func() error {
	db := sql.OpenDB(noConnector{})
	_ = db.Close()
	return db.PingContext(context.Background())
}()

// noConnector is a driver.Connector that connects nowhere, for errDBClosed.
type noConnector struct{}

func (noConnector) Connect(context.Context) (driver.Conn, error) { return nil, driver.ErrBadConn }
func (noConnector) Driver() driver.Driver                        { return nil }

// closedDB makes err, when the user closed the *sql.DB, match
// fence.ErrClosed too: it grants no more leases, and fence.Lead stops
// campaigning on it. Acquire does not wait on such an error.
func closedDB(err error) error {
	if errors.Is(err, errDBClosed) && !errors.Is(err, fence.ErrClosed) {
		return fmt.Errorf("%w (%w)", err, fence.ErrClosed)
	}
	return err
}

// firstTryMin is the least time an Acquire with a Wait budget gives its
// first try, whatever the budget: a round trip, a dial, a short wait for
// a row lock that a grant or a release holds.
const firstTryMin = time.Second

// giveUpTimeout bounds each statement of the clean-up of an acquisition
// given up on.
const giveUpTimeout = 2 * time.Second

// terminateMargin is how much sooner than the statement's ctx the server's
// wait for a terminated backend (pg_terminate_backend's timeout) ends, so
// that the server answers before the ctx ends.
const terminateMargin = 250 * time.Millisecond

// giveUp frees, owner-checked and in the background, a row that a try whose
// reply was lost may have taken after all, so that the lock is not held by
// nobody until it expires. First it terminates the backends that may still
// run such a try (see runTry), and waits for them to go: a try still in a
// stalled backend's socket, or blocked, would otherwise take the row after
// the free. It runs after the caller's ctx may have ended, each statement
// bounded by giveUpTimeout, and does not hold up the caller's return.
func (l *Locker) giveUp(a *attempt) {
	if !a.sent && len(a.stale) == 0 {
		return
	}
	l.freeOwnedAfter(a.name, a.owner, a.stale)
}

// freeOwned frees the row of name if owner still holds it, in the
// background, bounded by giveUpTimeout.
func (l *Locker) freeOwned(name, owner string) { l.freeOwnedAfter(name, owner, nil) }

// freeOwnedAfter is freeOwned once the stale backends have been terminated
// and are gone, or giveUpTimeout has passed. done is closed once the
// release has been tried.
func (l *Locker) freeOwnedAfter(name, owner string, stale []backendRef) (done <-chan struct{}) {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		l.terminate(stale)
		ctx, cancel := context.WithTimeout(context.Background(), giveUpTimeout)
		defer cancel()
		_, _ = l.db.ExecContext(ctx, l.q.release, name, owner, l.table)
	}()
	return ch
}

// terminate ends the backends of stale, which may yet run a try whose
// outcome was unknown, and waits for them to go, within giveUpTimeout in
// all. A backend signalled to terminate runs no statement further: one it
// has not read yet, or reads as it resumes, fails at its first check for
// interrupts (an idle backend ignores a cancel, not a termination), and
// one under way is aborted unless it was committing. Once the backend is
// gone, whatever it committed is visible to the owner-checked free that
// follows. Errors are ignored: without the right to terminate, or on
// PostgreSQL before 14 (no timeout argument: the backend is then only
// signalled), the free runs as it would without this.
func (l *Locker) terminate(stale []backendRef) {
	if len(stale) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), giveUpTimeout)
	defer cancel()
	if len(stale) > 1 {
		// Signal them all first, so that the wait for one does not
		// delay the next one's end.
		for _, b := range stale {
			_ = l.execAsSessionUser(ctx, terminateQuery(false), b.pid, b.port, b.age())
		}
	}
	for _, b := range stale {
		d, _ := ctx.Deadline()
		wait := (time.Until(d) - terminateMargin).Milliseconds()
		if wait <= 0 {
			return
		}
		err := l.execAsSessionUser(ctx, terminateQuery(true), b.pid, b.port, b.age(), wait)
		if isSQLState(err, undefinedFunction) {
			_ = l.execAsSessionUser(ctx, terminateQuery(false), b.pid, b.port, b.age())
		}
	}
}

// execAsSessionUser runs q as the session's user, the role that logged in
// and whose backends the stale ones are, in a transaction of its own: a
// session may have set another role (options -c role=, SET ROLE), one
// that is not a member of the login role, to which pg_stat_activity hides
// those backends' client_port and backend_start, and which may not
// terminate them. A session may always return to its session user; were
// that refused, q runs as the current role.
func (l *Locker) execAsSessionUser(ctx context.Context, q string, args ...any) error {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SET LOCAL ROLE NONE`); err != nil {
		// Refused (whatever the reason): as the current role, then.
		_ = tx.Rollback()
		_, err = l.db.ExecContext(ctx, q, args...)
		return err
	}
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return err
	}
	return tx.Commit()
}

// age is how long ago, in microseconds, b's connection was known open,
// less 1% for the two clocks' rates (as deadline allows): b's backend
// started before the database's clock_timestamp() less that.
func (b backendRef) age() int64 {
	age := time.Since(b.opened)
	return (age - age/100).Microseconds()
}

// signal terminates the backends of stale without waiting for them to go,
// after a try that took the lock: a backend signalled dies before it runs
// a statement further (see terminate), so the lease's Release, which comes
// after this, frees the row for good. Waiting for them to go would hold
// one of the pool's connections, and the Acquire, for up to giveUpTimeout.
// It is bounded by ctx (the Acquire's) and giveUpTimeout, and returns an
// error if a signal may not have been sent: the caller must then not hand
// out the lease (see try).
func (l *Locker) signal(ctx context.Context, stale []backendRef) error {
	sctx, cancel := context.WithTimeout(ctx, giveUpTimeout)
	defer cancel()
	for _, b := range stale {
		if err := l.execAsSessionUser(sctx, terminateQuery(false), b.pid, b.port, b.age()); err != nil {
			return err
		}
	}
	return nil
}

// undefinedFunction is the SQLSTATE of a call to a function that does not
// exist: pg_terminate_backend(pid, timeout) before PostgreSQL 14.
const undefinedFunction = "42883"

// terminateQuery terminates the backend with PID $1 whose client's port is
// $2 (-1: a Unix socket), if it is a client backend of this database
// that started over $3 microseconds ago, and, with wait, waits $4
// milliseconds at most for it to go. The start tells our connection's
// backend from another that took its PID since it went (over a Unix
// socket, every client's port is -1; a small pid_max wraps in seconds),
// and the port from the backend behind a proxy (pgbouncer), whose PID the
// proxy made up and whose client is the proxy: that one is left alone.
func terminateQuery(wait bool) string {
	call := "pg_terminate_backend(pid)"
	if wait {
		call = "pg_terminate_backend(pid, $4::bigint)"
	}
	return `SELECT ` + call + ` FROM pg_stat_activity
WHERE pid = $1::int AND client_port = $2::int
  AND backend_start < clock_timestamp() - $3::bigint * interval '1 microsecond'
  AND backend_type = 'client backend' AND datname = current_database()`
}

// attempt is one Acquire's identity: the owner is unique to it.
type attempt struct {
	name     string
	owner    string
	ttl      time.Duration
	watchdog bool
	sent     bool // a try was sent whose outcome is unknown
	noConn   bool // the last try failed to get a connection: it sent nothing
	// stale are the backends of the connections that pgx closed on a try
	// whose outcome is unknown: they may still run it (see runTry).
	stale []backendRef
}

// try inserts the lock row, or takes over an expired one. It returns the
// lease, or how long the holder's lease has left by the database's clock
// (zero: try again now).
func (l *Locker) try(ctx context.Context, a *attempt) (*lease, time.Duration, error) {
	for {
		sent := time.Now()
		token, err := l.runTry(ctx, a)
		switch {
		case err == nil:
			a.sent = false
			if stale := a.stale; len(stale) > 0 {
				// An earlier try may yet run in a backend of its own:
				// harmless while this lease lives (the row is its
				// owner's), it would take the row back once released,
				// held by nobody until it expired. So the backends are
				// signalled before the lease is returned: signalled
				// in the background, the signal could come after the
				// lease's Release had freed the row (a loaded CI run,
				// 2026-12-04: with a pool of one connection, Extend and
				// Release took it first, and the stalled try, resumed,
				// took the row back).
				a.stale = nil
				if err := l.signal(ctx, stale); err != nil {
					// Not signalled (ctx ended, the pool had no
					// connection in time): a lease returned now, its
					// Release could free the row before a signal sent
					// later, and a stalled try take it back
					// (TestStaleSignalCutByCtxReleaseOvertakes). Give
					// the row back as a given-up Acquire does, once the
					// backends are terminated and gone, and try again,
					// if at all, as a new owner.
					select {
					case <-l.freeOwnedAfter(a.name, a.owner, stale):
					case <-ctx.Done():
					}
					a.owner = newOwner()
					return nil, 0, fmt.Errorf("pglock: acquire %q: %w: %w", a.name, errUnsignalled, err)
				}
			}
			if replied := time.Now(); !replied.Before(deadline(sent, a.ttl)) {
				// Taken with a reply past the lease's deadline (a
				// stalled backend, a statement that waited on the
				// row's lock): the lease would be over before anyone
				// used it. Give the row back, owner-checked, and try
				// again, if at all, as a new owner.
				// Waited for while ctx lasts: a caller that tries
				// again at once finds the row free.
				select {
				case <-l.freeOwnedAfter(a.name, a.owner, nil):
				case <-ctx.Done():
				}
				a.owner = newOwner()
				return nil, 0, fmt.Errorf("pglock: acquire %q: %w: %v after the try was sent, past the lease's deadline (lease time %v); given back", a.name, errLateReply, replied.Sub(sent).Round(time.Millisecond), a.ttl)
			}
			return l.newLease(ctx, a, fence.Token(token), sent), 0, nil
		case unstorableName(err):
			a.sent = false // the name was refused as the statement was bound: it took nothing
			return nil, 0, fmt.Errorf("pglock: acquire %q: %w: the database's encoding cannot store it: %w", a.name, fence.ErrInvalidName, err)
		case isSQLState(err, sequenceLimitExceeded), isSQLState(err, numericOutOfRange):
			a.sent = false // nextval failed: the statement took nothing
			return nil, 0, fmt.Errorf("pglock: acquire %q: %w: %w", a.name, ErrTokensExhausted, err)
		case isSQLState(err, serializationFailure):
			// Under repeatable read or serializable (an operator's
			// default_transaction_isolation), a grant or a release
			// committed on the row while this statement waited for it,
			// where read committed would have re-checked the row: the
			// statement took nothing. Look at the row as it is now, as
			// when it did not match.
		case !errors.Is(err, sql.ErrNoRows):
			a.sent = true
			return nil, 0, fmt.Errorf("pglock: acquire %q: %w", a.name, err)
		}
		a.sent = false
		var leftUs int64
		err = l.db.QueryRowContext(ctx, l.q.left, a.name).Scan(&leftUs)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			// The name's first acquisition (or its row was deleted):
			// create the row, free, and try again.
			// A serialization failure (repeatable read, serializable): a
			// concurrent first acquisition created the row; try again.
			if _, err := l.db.ExecContext(ctx, l.q.create, a.name); err != nil && !isSQLState(err, serializationFailure) {
				return nil, 0, fmt.Errorf("pglock: acquire %q: %w", a.name, err)
			}
			continue
		case isSQLState(err, serializationFailure):
			// Serializable: the read of the row conflicted with a
			// concurrent first acquisition's create or take (seen under
			// load in TestSerializableDefaultIsolation); it read
			// nothing: try again.
			continue
		case err != nil:
			return nil, 0, fmt.Errorf("pglock: acquire %q: %w", a.name, err)
		}
		// A millisecond past the expiry, so that the next try finds it
		// expired; zero (freed in between): try again now.
		if leftUs <= 0 {
			return nil, 0, nil
		}
		return nil, time.Duration(leftUs)*time.Microsecond + time.Millisecond, nil
	}
}

// serializationFailure is the SQLSTATE of a statement that, under
// repeatable read or serializable, found its row updated by a transaction
// that committed after its snapshot (serialization_failure).
const serializationFailure = "40001"

// sequenceLimitExceeded is the SQLSTATE of nextval past a sequence's
// maximum (sequence_generator_limit_exceeded).
const sequenceLimitExceeded = "2200H"

// unstorableName reports whether err is the database's refusal of a lock
// name that its encoding cannot represent (a LATIN1 database, a client
// whose client_encoding is UTF8): untranslatable_character or
// character_not_in_repertoire. It is bad input, not a backend failure:
// Acquire does not retry it.
func unstorableName(err error) bool {
	return isSQLState(err, "22P05") || isSQLState(err, "22021")
}

// numericOutOfRange is the SQLSTATE of the row's last token plus one past
// the bigint maximum (numeric_value_out_of_range): that name can have no
// greater token.
const numericOutOfRange = "22003"

// isSQLState reports whether err carries the SQLSTATE code, as the errors of
// pgx (*pgconn.PgError) and lib/pq (*pq.Error) do through SQLState().
func isSQLState(err error, code string) bool {
	var e interface{ SQLState() string }
	return errors.As(err, &e) && e.SQLState() == code
}

func newOwner() string {
	var b [ownerLen / 2]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ownerLen is the length of an owner: 128 random bits in hexadecimal.
const ownerLen = 32

// made refuses a Locker that New did not make (a zero Locker, or a nil
// one): it has nothing to lock with, and Acquire panicked on it.
func (l *Locker) made() error {
	if l == nil || l.db == nil {
		return fmt.Errorf("%w: pglock: a Locker not made by New (zero or nil): use pglock.New", fence.ErrInvalidOption)
	}
	return nil
}
