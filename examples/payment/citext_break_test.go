package payment_test

import (
	"errors"
	"testing"

	"github.com/fencekit/fence/examples/payment"
)

// TestApproveOnceKeysEqualInTheColumn: fence_idempotency's key made
// citext by its owner (guard.Once takes a key column of another type,
// and case-blind keys are a common wish), so that "approve 1001
// 5:Alice k1" and "approve 1001 5:alice k1" are one key. Alice approved
// with k1; alice (another approver to the service, which compares names
// exactly) sent k1: her key was found recorded and she was told that she
// approved, 200 and Alice's token ("alice after Alice, one citext key:
// token T, <nil>; want ErrAlreadyApproved" before de5120a). A recorded
// key stands for this approval only when the payment says so.
func TestApproveOnceKeysEqualInTheColumn(t *testing.T) {
	e := setup(t)
	db := e.dbs["postgres"]
	for _, stmt := range []string{`CREATE EXTENSION IF NOT EXISTS citext`, `ALTER TABLE fence_idempotency ALTER COLUMN key TYPE citext`} {
		if _, err := db.ExecContext(ctx(t), stmt); err != nil {
			t.Fatal(err)
		}
	}
	svc := &payment.Service{Locker: e.locker, DB: db}
	if _, err := svc.ApproveOnce(ctx(t), 1001, "Alice", "k1"); err != nil {
		t.Fatal(err)
	}
	if token, err := svc.ApproveOnce(ctx(t), 1001, "alice", "k1"); !errors.Is(err, payment.ErrAlreadyApproved) {
		t.Fatalf("alice after Alice, one citext key: token %d, %v; want ErrAlreadyApproved", token, err)
	}
	wantCharges(t, db, 1001, 1)
}
