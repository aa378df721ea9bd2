package payment_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/fencekit/fence/examples/payment"
)

// TestApproveOnce: an approval sent again with its key (and approver) is
// answered as the first was, and charges nothing more; anything else that
// finds the payment approved is ErrAlreadyApproved: another approver with
// the same key, the same approver with another key or none, and an
// approver and key that spell the same words split elsewhere (without the
// approver's length in the recorded key, "x y" + "z" and "x" + "y z" were
// one key, and the second was told it approved). A key whose approval did
// not commit is not recorded; a bad key is refused before anything is
// locked.
func TestApproveOnce(t *testing.T) {
	e := setup(t)
	for name, db := range e.dbs {
		t.Run(name, func(t *testing.T) {
			svc := &payment.Service{Locker: e.locker, DB: db}
			first, err := svc.ApproveOnce(ctx(t), 1001, "alice", "k1")
			if err != nil {
				t.Fatal(err)
			}
			again, err := svc.ApproveOnce(ctx(t), 1001, "alice", "k1")
			if err != nil || again != first {
				t.Fatalf("resent ApproveOnce = %d, %v; want %d, nil", again, err, first)
			}
			for _, c := range []struct{ by, key string }{{"bob", "k1"}, {"alice", "k2"}, {"alice", ""}} {
				var err error
				if c.key == "" {
					_, err = svc.Approve(ctx(t), 1001, c.by)
				} else {
					_, err = svc.ApproveOnce(ctx(t), 1001, c.by, c.key)
				}
				if !errors.Is(err, payment.ErrAlreadyApproved) {
					t.Errorf("approval by %q with key %q of an approved payment: %v, want ErrAlreadyApproved", c.by, c.key, err)
				}
			}
			wantCharges(t, db, 1001, 1)

			if err := payment.Insert(ctx(t), db, 1002, 100); err != nil {
				t.Fatal(err)
			}
			if _, err := svc.ApproveOnce(ctx(t), 1002, "x y", "z"); err != nil {
				t.Fatal(err)
			}
			if _, err := svc.ApproveOnce(ctx(t), 1002, "x", "y z"); !errors.Is(err, payment.ErrAlreadyApproved) {
				t.Errorf(`"x" with key "y z" after "x y" with key "z": %v, want ErrAlreadyApproved`, err)
			}

			if err := payment.Insert(ctx(t), db, 1003, 100); err != nil {
				t.Fatal(err)
			}
			if _, err := svc.Approve(ctx(t), 1003, "bob"); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if _, err := svc.ApproveOnce(ctx(t), 1003, "alice", "k"); !errors.Is(err, payment.ErrAlreadyApproved) {
					t.Errorf("alice's keyed approval of bob's payment: %v, want ErrAlreadyApproved each time", err)
				}
			}
			wantCharges(t, db, 1003, 1)

			for _, key := range []string{"", strings.Repeat("k", payment.MaxKey+1), "nul\x00", "\xff", "line\nbreak"} {
				if _, err := svc.ApproveOnce(ctx(t), 1002, "alice", key); !errors.Is(err, payment.ErrInvalidKey) {
					t.Errorf("key %q: %v, want ErrInvalidKey", key, err)
				}
			}
		})
	}
}

func wantCharges(t *testing.T, db *sql.DB, id int64, n int) {
	t.Helper()
	charges, err := payment.Charges(ctx(t), db, id)
	if err != nil || len(charges) != n {
		t.Fatalf("payment %d: charges %+v, %v; want %d", id, charges, err, n)
	}
}
