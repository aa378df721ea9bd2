package payment_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/payment"
)

// TestApproveKeepsCallersDeadline: the database does not answer (another
// transaction holds payment 1001's row) and the caller gives Approve one
// second. Approve must give up within that second, having charged
// nothing, and the payment must be approvable once the row is free. Before,
// the transaction ran on a context cut from the caller's (so that a lease
// lost meanwhile would not stop it: the fence must), which dropped the
// caller's deadline too: Approve returned after LockLease, 10 s.
func TestApproveKeepsCallersDeadline(t *testing.T) {
	e := setup(t)
	db := e.dbs["postgres"]
	hold, err := db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if _, err := hold.ExecContext(ctx(t), `SELECT 1 FROM payment WHERE id = 1001 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	svc := &payment.Service{Locker: e.locker, DB: db}
	c, cancel := context.WithTimeout(ctx(t), time.Second)
	defer cancel()
	start := time.Now()
	_, err = svc.Approve(c, 1001, "A")
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || took > payment.LockLease/2 {
		t.Fatalf("Approve with a 1 s deadline, row held: %v after %v; want context.DeadlineExceeded within the deadline", err, took)
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	if charges, err := payment.Charges(ctx(t), db, 1001); err != nil || len(charges) != 0 {
		t.Fatalf("charges after the abandoned approval: %+v, %v", charges, err)
	}
	if _, err := svc.Approve(ctx(t), 1001, "B"); err != nil {
		t.Fatalf("approval once the row is free: %v", err)
	}
}
