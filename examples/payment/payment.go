// Package payment is the article's payment approval as a small service:
// lock lock:payment:<id> (wait 2 s, lease 10 s), then, in one transaction
// fenced with the lease's token (guard.Tx), read the payment, approve it and
// record the charge. The fence comes first: a worker whose lease was
// overtaken is rejected before it reads, and a newer worker waits for an
// older one's transaction and then reads its write. Either way the payment
// is charged once.
//
// ApproveTokenOnly is the article's version, the conditional update
//
//	UPDATE payment SET status = 'APPROVED', approved_by = $3, last_fencing_token = $2
//	 WHERE id = $1 AND last_fencing_token < $2
//
// with the payment read before it. It charges twice when the stale worker
// writes first. ApproveWithoutFencing ignores the token altogether. Both
// are kept to show the hazards; do not use them.
//
// cmd/paymentd serves it over HTTP; fence demo tells its story.
package payment

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/nilctx"
)

// The article's numbers: wait up to 2 s for the lock, hold it at most 10 s.
const (
	LockWait  = 2 * time.Second
	LockLease = 10 * time.Second
)

// Schema creates the payment and charge tables (PostgreSQL and SQLite).
const Schema = createPayment + ";" + createCharge

const (
	createPayment = `
CREATE TABLE IF NOT EXISTS payment (
	id                 BIGINT PRIMARY KEY,
	amount             BIGINT NOT NULL,
	status             TEXT   NOT NULL DEFAULT 'PENDING',
	approved_by        TEXT,
	last_fencing_token BIGINT NOT NULL DEFAULT 0
)`
	createCharge = `
CREATE TABLE IF NOT EXISTS charge (
	payment_id BIGINT NOT NULL,
	amount     BIGINT NOT NULL,
	charged_by TEXT   NOT NULL,
	token      BIGINT NOT NULL
)`
	// schemaPG is Schema on PostgreSQL, where each table is made only if
	// none is visible on the search_path, looked up under
	// CreateIfNotExists's lock: a process that waited for it finds what
	// the one before it made (TestCreateSchemaRaceWithCreatorOnPath).
	schemaPG = `DO $$ BEGIN
IF to_regclass('payment') IS NULL THEN` + createPayment + `; END IF;
IF to_regclass('charge') IS NULL THEN` + createCharge + `; END IF;
END $$`
)

// Errors of the service.
var (
	ErrNotFound        = errors.New("payment: no such payment")
	ErrAlreadyApproved = errors.New("payment: already approved")
	// ErrInvalidApprover: the approver's name is empty, longer than
	// MaxApprover bytes, not UTF-8 (PostgreSQL cannot store it), or holds
	// a control character. Nothing was locked or written.
	ErrInvalidApprover = errors.New("payment: invalid approver")
	// ErrInvalidKey: an idempotency key (ApproveOnce) that is empty,
	// longer than MaxKey bytes, not UTF-8 or holds a control character.
	// Nothing was locked or written.
	ErrInvalidKey = errors.New("payment: invalid idempotency key")
)

// MaxApprover is the longest approver name, in bytes, that Approve takes.
const MaxApprover = 256

// MaxKey is the longest idempotency key, in bytes, that ApproveOnce takes.
const MaxKey = 200

func checkKey(key string) error {
	if key == "" || len(key) > MaxKey || !utf8.ValidString(key) || strings.ContainsFunc(key, unicode.IsControl) {
		return fmt.Errorf("%w: %.40q (%d bytes)", ErrInvalidKey, key, len(key))
	}
	return nil
}

// onceKey is the guard.Once key of an approval sent with key: the
// payment, the approver and key, the approver's length first, so that
// no other approver and key make the same string.
func onceKey(id int64, by, key string) string {
	return fmt.Sprintf("approve %d %d:%s %s", id, len(by), by, key)
}

func checkApprover(by string) error {
	if by == "" || len(by) > MaxApprover || !utf8.ValidString(by) || strings.ContainsFunc(by, unicode.IsControl) {
		return fmt.Errorf("%w: %.40q (%d bytes)", ErrInvalidApprover, by, len(by))
	}
	return nil
}

var payments = guard.Table{Name: "payment", Key: "id", Column: "last_fencing_token"}

// LockName is the lock that every approval of payment id takes.
func LockName(id int64) string { return "lock:payment:" + strconv.FormatInt(id, 10) }

// Service approves payments.
type Service struct {
	Locker fence.Locker
	DB     *sql.DB

	// LockOptions are appended to fence.Wait(LockWait) and
	// fence.TTL(LockLease) when the lock is taken; a later option wins.
	LockOptions []fence.Option

	// Pause, if set, is called at each Step of an approval with the lease's
	// token: a place for tests and the demo to inject a pause.
	Pause func(ctx context.Context, step Step, id int64, token fence.Token)

	// Log receives the details of the errors that Handler answers with a
	// generic 500, and, as warnings, the statement timeouts it answers
	// with 503; nil means slog.Default().
	Log *slog.Logger
}

// Step is a point in an approval where Service.Pause is called.
type Step int

// The steps of an approval, in order.
const (
	Locked  Step = iota // the lease is held; nothing is read yet
	Read                // the payment was read and is pending; nothing is written yet
	Written             // the approval and the charge are written, not yet committed
)

func (s Step) String() string {
	switch s {
	case Locked:
		return "locked"
	case Read:
		return "read"
	case Written:
		return "written"
	}
	return fmt.Sprintf("Step(%d)", int(s))
}

// Payment is one row of the payment table.
type Payment struct {
	ID         int64       `json:"id"`
	Amount     int64       `json:"amount"`
	Status     string      `json:"status"`
	ApprovedBy string      `json:"approved_by"` // as the approve answer names it
	Token      fence.Token `json:"token"`       // the last fencing token that wrote the row
}

// Charge is one row of the charge table: money taken.
type Charge struct {
	Amount int64
	By     string
	Token  fence.Token
}

// CreateSchema creates the tables, the guard's included. Workers that start
// at once may call it together (guard.CreateIfNotExists). Once the tables
// are there it creates nothing, so that paymentd starts as a role granted
// their rows and not CREATE on the schema (PostgreSQL checks that
// privilege before it looks whether a CREATE TABLE IF NOT EXISTS's table
// exists: TestCreateSchemaWithoutCreateOnSchema). A table counts as there
// when it is visible on the connection's search_path, in whichever schema,
// as guard.CreateTables counts its own: the one the service's unqualified
// queries use. A role whose own schema comes first on the path ("$user",
// public) so uses public's tables, rather than get empty ones of its own
// (TestCreateSchemaWithOwnSchemaFirstOnPath).
func CreateSchema(ctx context.Context, db *sql.DB) error {
	if ctx == nil {
		return nilctx.Err("payment", "CreateSchema")
	}
	var n int
	stmt := schemaPG
	switch err := db.QueryRowContext(ctx, `SELECT (to_regclass('payment') IS NOT NULL)::int + (to_regclass('charge') IS NOT NULL)::int`).Scan(&n); {
	case err == nil:
	case ctx.Err() != nil || sqlState(err) != "":
		// PostgreSQL's error: Schema would make the tables in
		// current_schema(), visible elsewhere or not.
		return err
	default:
		// SQLite, where to_regclass is unknown: Schema runs, as it
		// may there.
		stmt, n = Schema, 0
	}
	if n < 2 {
		if err := guard.CreateIfNotExists(ctx, db, stmt); err != nil {
			return err
		}
	}
	return guard.CreateTables(ctx, db)
}

// Insert adds a pending payment.
func Insert(ctx context.Context, db *sql.DB, id, amount int64) error {
	if ctx == nil {
		return nilctx.Err("payment", "Insert")
	}
	_, err := db.ExecContext(ctx, `INSERT INTO payment (id, amount) VALUES ($1, $2)`, id, amount)
	return err
}

// Get reads a payment; ErrNotFound if there is none, fence.ErrInvalidOption
// if db or ctx is nil (as every call here that takes a ctx returns for a
// nil one).
func Get(ctx context.Context, db *sql.DB, id int64) (Payment, error) {
	if ctx == nil {
		return Payment{ID: id}, nilctx.Err("payment", "Get")
	}
	if db == nil {
		return Payment{ID: id}, fmt.Errorf("%w: payment: Get with a nil db", fence.ErrInvalidOption)
	}
	return get(ctx, db, id)
}

func get(ctx context.Context, db guard.Querier, id int64) (Payment, error) {
	p := Payment{ID: id}
	var by sql.NullString
	err := db.QueryRowContext(ctx, `SELECT amount, status, approved_by, last_fencing_token FROM payment WHERE id = $1`, id).
		Scan(&p.Amount, &p.Status, &by, &p.Token)
	if errors.Is(err, sql.ErrNoRows) {
		return p, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	p.ApprovedBy = by.String
	return p, err
}

// Charges lists the charges made for a payment, oldest first.
func Charges(ctx context.Context, db *sql.DB, id int64) ([]Charge, error) {
	if ctx == nil {
		return nil, nilctx.Err("payment", "Charges")
	}
	rows, err := db.QueryContext(ctx, `SELECT amount, charged_by, token FROM charge WHERE payment_id = $1 ORDER BY token`, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Charge
	for rows.Next() {
		var c Charge
		if err := rows.Scan(&c.Amount, &c.By, &c.Token); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// Approve approves payment id on behalf of by, under the payment's lock,
// with the fenced read-modify-write: guard.Tx fences the transaction with
// the lease's token, then the payment is read, approved and charged in it.
// It returns the lease's token; before anything is locked,
// ErrInvalidApprover for a name by that cannot be stored, ErrNotFound
// for a payment that does not exist, and one matching
// context.DeadlineExceeded if the database did not read it within
// LockLease; ErrAlreadyApproved (or ErrNotFound,
// deleted meanwhile) for a payment that is not pending under the lock;
// an error matching fence.ErrHeld when another
// worker kept the lock for the whole wait; one matching guard.ErrStale when
// a newer lease had fenced the payment first; and one matching
// guard.ErrRetry when the database gave up on a conflict (retry).
//
// The transaction ends with ctx (not with the lease: the fence stops a
// stale worker): an error matching ctx.Err() means it was rolled back,
// unless ctx ended during the commit itself, which the database may have
// finished; Get the payment to know.
func (s *Service) Approve(ctx context.Context, id int64, by string) (fence.Token, error) {
	if ctx == nil {
		return 0, nilctx.Err("payment", "Approve")
	}
	return s.locked(ctx, id, by, "", fenced)
}

// ApproveOnce is Approve for a request that may be sent again, such as an
// HTTP request with an Idempotency-Key, which net/http sends again by
// itself when its connection breaks before the answer: key is recorded
// (guard.Once) in the approval's fenced transaction, with the payment and
// the approver, and a later ApproveOnce with the same three, its approval
// committed, returns that approval's token and nil, as the first call
// would have, rather than ErrAlreadyApproved; so does a call overtaken by
// its own resend (its lease ran out first). Nothing is charged again. It
// returns ErrInvalidKey for a key that cannot be recorded.
func (s *Service) ApproveOnce(ctx context.Context, id int64, by, key string) (fence.Token, error) {
	if ctx == nil {
		return 0, nilctx.Err("payment", "ApproveOnce")
	}
	if err := checkKey(key); err != nil {
		return 0, err
	}
	token, err := s.locked(ctx, id, by, key, fenced)
	if errors.Is(err, guard.ErrStale) {
		// A newer approval committed while this one waited, perhaps this
		// key's own resend: asked again, under a new lease, the key gives
		// its answer, as the resend's was, or the payment says who
		// approved it (TestStaleFirstAnsweredAsItsResend).
		token, err = s.locked(ctx, id, by, key, fenced)
	}
	return token, err
}

// ApproveTokenOnly is the article's approval: read the payment, then the
// conditional update on its last_fencing_token column. It rejects a stale
// worker that writes after a newer one, but charges twice when the stale
// worker writes first. Kept for the demo and the tests; do not use it.
func (s *Service) ApproveTokenOnly(ctx context.Context, id int64, by string) (fence.Token, error) {
	if ctx == nil {
		return 0, nilctx.Err("payment", "ApproveTokenOnly")
	}
	return s.locked(ctx, id, by, "", tokenOnly)
}

// ApproveWithoutFencing is the approval with a plain UPDATE that ignores the
// token: the hazard the article describes, kept for the demo and the tests
// to compare against. Do not use it.
func (s *Service) ApproveWithoutFencing(ctx context.Context, id int64, by string) (fence.Token, error) {
	if ctx == nil {
		return 0, nilctx.Err("payment", "ApproveWithoutFencing")
	}
	return s.locked(ctx, id, by, "", unfenced)
}

type mode int

const (
	fenced    mode = iota // guard.Tx: fence, read, write
	tokenOnly             // read, then the conditional update
	unfenced              // read, then a plain update
)

// errDone ends the fenced transaction of an approval that ApproveOnce finds
// made before with its key.
var errDone = errors.New("payment: approved before with this key")

// locked approves under the payment's lock and returns the lease's token,
// or, when key is not empty and an approval with it committed before
// (ApproveOnce), that approval's token.
func (s *Service) locked(ctx context.Context, id int64, by, key string, m mode) (fence.Token, error) {
	if s.Locker == nil || s.DB == nil {
		return 0, fmt.Errorf("%w: payment: a Service needs a Locker and a DB", fence.ErrInvalidOption)
	}
	if err := checkApprover(by); err != nil {
		return 0, err
	}
	// A payment that does not exist is not locked: every lock name taken
	// leaves a last-token record in Redis for its retention period (a day
	// by default), and the id comes from the client. Nor is one that the
	// database did not read in time (a hung database must not hold the
	// caller for LockLease twice). Other failures (a pooled connection that
	// a database restart killed) are left to the read under the lock, which
	// checks again on a connection of its own.
	pre, cancelPre := context.WithTimeout(ctx, LockLease)
	_, err := get(pre, s.DB, id)
	cancelPre()
	if err != nil && (errors.Is(err, ErrNotFound) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil) {
		return 0, err
	}
	var token fence.Token
	committed := false
	err = fence.Run(ctx, s.Locker, LockName(id), func(leaseCtx context.Context, l fence.Lease) error {
		token = l.Token()
		s.pause(leaseCtx, Locked, id, token)
		// The database work runs on the caller's ctx, not the lease's: it
		// goes on if the lease ends meanwhile (a paused worker does not know
		// that it paused, and the fence, not the context, must stop it),
		// but it ends with the caller's deadline or cancellation (rolled
		// back, nothing written). LockLease bounds it too, so that a stuck
		// transaction does not hold the payment's row lock for ever.
		dbCtx, cancel := context.WithTimeout(ctx, LockLease)
		defer cancel()
		if m == fenced {
			err := guard.Tx(dbCtx, s.DB, Resource(id), token, func(tx *sql.Tx) error {
				if key != "" {
					err := guard.Once(dbCtx, tx, onceKey(id, by, key))
					if errors.Is(err, guard.ErrDuplicate) {
						p, err := get(dbCtx, tx, id)
						if err != nil {
							return err
						}
						// Done before: its token is the row's, unless a
						// later approval wrote it (none can: it stays
						// approved). A key found with the payment not
						// approved by by is not this approval's (another
						// service's guard.Once, or a payment reopened
						// since): approve as without it.
						if p.Status == "APPROVED" && p.ApprovedBy == by {
							token = p.Token
							return errDone
						}
					} else if err != nil {
						return err
					}
				}
				return s.approve(dbCtx, tx, id, by, token, m)
			})
			committed = err == nil || errors.Is(err, errDone)
			return err
		}
		return s.readThenWrite(dbCtx, id, by, token, m)
	}, append([]fence.Option{fence.Wait(LockWait), fence.TTL(LockLease)}, s.LockOptions...)...)
	if committed {
		// The fence accepted the token, so the approval stands even if the
		// lease ran out meanwhile and Run reports it lost (or it was made
		// before, with this key).
		return token, nil
	}
	return token, err
}

// Resource is the guard resource that approvals of payment id fence.
func Resource(id int64) string { return "payment:" + strconv.FormatInt(id, 10) }

// readThenWrite is the unsafe order: the payment is read outside the
// transaction that writes.
func (s *Service) readThenWrite(ctx context.Context, id int64, by string, token fence.Token, m mode) error {
	p, err := s.read(ctx, s.DB, id, token)
	if err != nil {
		return err
	}
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := s.write(ctx, tx, p, by, token, m); err != nil {
		return err
	}
	return tx.Commit()
}

// approve reads and writes in tx, after guard.Tx's fence.
func (s *Service) approve(ctx context.Context, tx *sql.Tx, id int64, by string, token fence.Token, m mode) error {
	p, err := s.read(ctx, tx, id, token)
	if err != nil {
		return err
	}
	return s.write(ctx, tx, p, by, token, m)
}

// read reads payment id and checks that it is pending.
func (s *Service) read(ctx context.Context, q guard.Querier, id int64, token fence.Token) (Payment, error) {
	p, err := get(ctx, q, id)
	if err != nil {
		return p, err
	}
	if p.Status != "PENDING" {
		return p, fmt.Errorf("%w: %d by %s", ErrAlreadyApproved, id, p.ApprovedBy)
	}
	s.pause(ctx, Read, id, token)
	return p, nil
}

// write approves p and records the charge in tx.
func (s *Service) write(ctx context.Context, tx *sql.Tx, p Payment, by string, token fence.Token, m mode) error {
	var err error
	if m == tokenOnly {
		err = payments.Update(ctx, tx, p.ID, token, "status = 'APPROVED', approved_by = $3", by)
	} else {
		_, err = tx.ExecContext(ctx, `UPDATE payment SET status = 'APPROVED', approved_by = $2, last_fencing_token = $3 WHERE id = $1`, p.ID, by, int64(token))
	}
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO charge (payment_id, amount, charged_by, token) VALUES ($1, $2, $3, $4)`,
		p.ID, p.Amount, by, int64(token)); err != nil {
		return err
	}
	s.pause(ctx, Written, p.ID, token)
	return nil
}

func (s *Service) pause(ctx context.Context, step Step, id int64, token fence.Token) {
	if s.Pause != nil {
		s.Pause(ctx, step, id, token)
	}
}
