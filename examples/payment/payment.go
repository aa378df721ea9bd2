// Package payment is the article's payment approval as a small service:
// lock lock:payment:<id> (wait 2 s, lease 10 s), read the payment, and
// approve it with the lease's fencing token through the conditional update
//
//	UPDATE payment SET status = 'APPROVED', approved_by = $3, last_fencing_token = $2
//	 WHERE id = $1 AND last_fencing_token < $2
//
// in the same transaction that records the charge. A worker that paused
// past its lease and comes back with an older token changes nothing.
//
// cmd/paymentd serves it over HTTP; fence demo tells its story.
package payment

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// The article's numbers: wait up to 2 s for the lock, hold it at most 10 s.
const (
	LockWait  = 2 * time.Second
	LockLease = 10 * time.Second
)

// Schema creates the payment and charge tables (PostgreSQL and SQLite).
const Schema = `
CREATE TABLE IF NOT EXISTS payment (
	id                 BIGINT PRIMARY KEY,
	amount             BIGINT NOT NULL,
	status             TEXT   NOT NULL DEFAULT 'PENDING',
	approved_by        TEXT,
	last_fencing_token BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS charge (
	payment_id BIGINT NOT NULL,
	amount     BIGINT NOT NULL,
	charged_by TEXT   NOT NULL,
	token      BIGINT NOT NULL
)`

// Errors of the service.
var (
	ErrNotFound        = errors.New("payment: no such payment")
	ErrAlreadyApproved = errors.New("payment: already approved")
)

var payments = guard.Table{Name: "payment", Key: "id", Column: "last_fencing_token"}

// LockName is the lock that every approval of payment id takes.
func LockName(id int64) string { return "lock:payment:" + strconv.FormatInt(id, 10) }

// Service approves payments.
type Service struct {
	Locker fence.Locker
	DB     *sql.DB

	// AfterRead, if set, runs after a worker has read a pending payment and
	// before it writes: a place to inject a pause in tests and the demo.
	AfterRead func(ctx context.Context, id int64, token fence.Token)
}

// Payment is one row of the payment table.
type Payment struct {
	ID         int64
	Amount     int64
	Status     string
	ApprovedBy string
	Token      fence.Token // the last fencing token that wrote the row
}

// Charge is one row of the charge table: money taken.
type Charge struct {
	Amount int64
	By     string
	Token  fence.Token
}

// CreateSchema creates the tables.
func CreateSchema(ctx context.Context, db *sql.DB) error {
	_, err := db.ExecContext(ctx, Schema)
	return err
}

// Insert adds a pending payment.
func Insert(ctx context.Context, db *sql.DB, id, amount int64) error {
	_, err := db.ExecContext(ctx, `INSERT INTO payment (id, amount) VALUES ($1, $2)`, id, amount)
	return err
}

// Get reads a payment; ErrNotFound if there is none.
func Get(ctx context.Context, db *sql.DB, id int64) (Payment, error) {
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

// Approve approves payment id on behalf of by, under the payment's lock. It
// returns the token the approval was written with; ErrAlreadyApproved or
// ErrNotFound for a payment that is not pending; an error matching
// fence.ErrNotAcquired when another worker kept the lock for 2 s; and one
// matching guard.ErrStale when this worker's lease had been overtaken by
// the time it wrote.
func (s *Service) Approve(ctx context.Context, id int64, by string) (fence.Token, error) {
	return s.locked(ctx, id, by, true)
}

// ApproveWithoutFencing is Approve with a plain UPDATE that ignores the
// token: the hazard the article describes, kept for the demo and the tests
// to compare against. Do not use it.
func (s *Service) ApproveWithoutFencing(ctx context.Context, id int64, by string) (fence.Token, error) {
	return s.locked(ctx, id, by, false)
}

// locked approves under the payment's lock and returns the lease's token.
func (s *Service) locked(ctx context.Context, id int64, by string, fenced bool) (fence.Token, error) {
	var token fence.Token
	err := fence.Run(ctx, s.Locker, LockName(id), func(ctx context.Context, lease fence.Lease) error {
		token = lease.Token()
		return s.approve(ctx, id, by, token, fenced)
	}, fence.Wait(LockWait), fence.TTL(LockLease))
	return token, err
}

func (s *Service) approve(ctx context.Context, id int64, by string, token fence.Token, fenced bool) error {
	p, err := Get(ctx, s.DB, id)
	if err != nil {
		return err
	}
	if p.Status != "PENDING" {
		return fmt.Errorf("%w: %d by %s", ErrAlreadyApproved, id, p.ApprovedBy)
	}
	if s.AfterRead != nil {
		s.AfterRead(ctx, id, token)
	}
	// The write runs even if the lease has ended meanwhile: a paused worker
	// does not know that it paused. Only the token comparison saves us.
	ctx = context.WithoutCancel(ctx)
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if fenced {
		err = payments.Update(ctx, tx, id, token, "status = 'APPROVED', approved_by = $3", by)
	} else {
		_, err = tx.ExecContext(ctx, `UPDATE payment SET status = 'APPROVED', approved_by = $2, last_fencing_token = $3 WHERE id = $1`, id, by, int64(token))
	}
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO charge (payment_id, amount, charged_by, token) VALUES ($1, $2, $3, $4)`,
		id, p.Amount, by, int64(token)); err != nil {
		return err
	}
	return tx.Commit()
}
