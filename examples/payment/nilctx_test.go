package payment_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/payment"
	"github.com/fencekit/fence/internal/nilctx/nilctxtest"
)

// TestNilContext: every call of the package that takes a ctx returns an
// error matching fence.ErrInvalidOption for a nil one, naming it, as
// fence's Lockers and guard do, on both databases, and changes nothing.
// Before, Insert, Get, Charges and CreateSchema panicked ('runtime error:
// invalid memory address or nil pointer dereference') and the four
// approvals with 'cannot create context from nil parent'.
func TestNilContext(t *testing.T) {
	e := setup(t)
	var noCtx context.Context // nil: the case under test
	for name, db := range e.dbs {
		t.Run(name, func(t *testing.T) {
			svc := &payment.Service{Locker: e.locker, DB: db}
			for _, c := range []struct {
				what string
				call func() error
			}{
				{"CreateSchema", func() error { return payment.CreateSchema(noCtx, db) }},
				{"Insert", func() error { return payment.Insert(noCtx, db, 1002, 100) }},
				{"Get", func() error { _, err := payment.Get(noCtx, db, 1001); return err }},
				{"Charges", func() error { _, err := payment.Charges(noCtx, db, 1001); return err }},
				{"Approve", func() error { _, err := svc.Approve(noCtx, 1001, "w1"); return err }},
				{"ApproveOnce", func() error { _, err := svc.ApproveOnce(noCtx, 1001, "w1", "k1"); return err }},
				{"ApproveTokenOnly", func() error { _, err := svc.ApproveTokenOnly(noCtx, 1001, "w1"); return err }},
				{"ApproveWithoutFencing", func() error { _, err := svc.ApproveWithoutFencing(noCtx, 1001, "w1"); return err }},
			} {
				err := nilCtxErr(c.call)
				if !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), c.what+" with a nil context") {
					t.Errorf("%s(nil) = %v, want an error matching fence.ErrInvalidOption saying '%s with a nil context'", c.what, err, c.what)
				}
			}
			if p, err := payment.Get(ctx(t), db, 1001); err != nil || p.Status != "PENDING" {
				t.Errorf("payment 1001 after the calls with a nil ctx: %+v, %v; want it pending", p, err)
			}
			if _, err := payment.Get(ctx(t), db, 1002); !errors.Is(err, payment.ErrNotFound) {
				t.Errorf("payment 1002 after Insert(nil): %v, want payment.ErrNotFound", err)
			}
		})
	}
}

// nilCtxErr is nilctxtest.Call.
var nilCtxErr = nilctxtest.Call
