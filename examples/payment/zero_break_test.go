package payment_test

import (
	"errors"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/payment"
)

// TestServiceWithoutDBOrLocker: a Service missing its DB or its Locker is a
// configuration error, fence.ErrInvalidOption from every approval, not a
// panic. Before, ApproveTokenOnly and ApproveWithoutFencing dereferenced
// the nil *sql.DB after taking the lock.
func TestServiceWithoutDBOrLocker(t *testing.T) {
	e := setup(t)
	for name, svc := range map[string]*payment.Service{
		"no DB":     {Locker: e.locker},
		"no Locker": {DB: e.dbs["sqlite"]},
		"zero":      {},
	} {
		for _, ap := range approvals {
			t.Run(name+"/"+ap.name, func(t *testing.T) {
				var err error
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Fatalf("panic: %v", r)
						}
					}()
					_, err = ap.approve(svc)(ctx(t), 1001, "alice")
				}()
				if !errors.Is(err, fence.ErrInvalidOption) {
					t.Fatalf("%v, want fence.ErrInvalidOption", err)
				}
			})
		}
	}
}
