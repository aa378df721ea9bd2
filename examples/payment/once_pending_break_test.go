package payment_test

import (
	"testing"

	"github.com/fencekit/fence/examples/payment"
	"github.com/fencekit/fence/guard"
)

// TestApproveOnceKeyRecordedButPaymentPending: ApproveOnce's key is found
// recorded in fence_idempotency while the payment is pending: the key was
// recorded by another user of guard.Once in the same database (the table
// is one namespace for every service), or the payment was reopened since
// its keyed approval (as reset does). Before, ApproveOnce took the
// recorded key for its own approval and returned the row's token, 0, and
// nil without approving: the handler would have answered 200 "APPROVED"
// with token 0 for a payment still PENDING, never charged (PostgreSQL and
// SQLite: "key recorded by another service: token 0, <nil>; payment
// {ID:1001 Amount:5000 Status:PENDING ApprovedBy: Token:0}").
// Now the payment is approved.
func TestApproveOnceKeyRecordedButPaymentPending(t *testing.T) {
	e := setup(t)
	for name, db := range e.dbs {
		t.Run(name, func(t *testing.T) {
			reset(t, e, db)
			svc := &payment.Service{Locker: e.locker, DB: db}
			// Another service's key, spelled as ApproveOnce's would be.
			if err := guard.Once(ctx(t), db, "approve 1001 5:alice k1"); err != nil {
				t.Fatal(err)
			}
			token, err := svc.ApproveOnce(ctx(t), 1001, "alice", "k1")
			p, gerr := payment.Get(ctx(t), db, 1001)
			if gerr != nil {
				t.Fatal(gerr)
			}
			if err != nil || token == 0 || p.Status != "APPROVED" || p.Token != token {
				t.Fatalf("key recorded by another service: token %d, %v; payment %+v; want approved with a token", token, err, p)
			}
			wantCharges(t, db, 1001, 1)

			// The payment is reopened; its keyed approval is sent again.
			reset(t, e, db)
			token, err = svc.ApproveOnce(ctx(t), 1001, "alice", "k1")
			if p, gerr = payment.Get(ctx(t), db, 1001); gerr != nil {
				t.Fatal(gerr)
			}
			if err != nil || token == 0 || p.Status != "APPROVED" || p.Token != token {
				t.Fatalf("reopened payment: token %d, %v; payment %+v; want approved with a token", token, err, p)
			}
			wantCharges(t, db, 1001, 1)
		})
	}
}
