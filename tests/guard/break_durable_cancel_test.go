package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// cancelAfterFirst is a Querier that ends its ctx once its first statement
// has returned: on SQLite, right after the refusal of the durable form of
// a token-recording statement, before its plain form.
type cancelAfterFirst struct {
	guard.Querier
	cancel context.CancelFunc
	n      int
}

func (c *cancelAfterFirst) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := c.Querier.ExecContext(ctx, query, args...)
	if c.n++; c.n == 1 {
		c.cancel()
	}
	return res, err
}

// TestCancelAfterDurableFormRefused: on SQLite, ctx ending between the
// refusal of a token-recording statement's durable form and its plain form
// must be reported as ctx's end. Before the fix Fence (with and without a
// call id), Table.Update and Once returned SQLite's refusal, "SQL logic
// error: no such function: set_config (1)", which matched neither
// context.Canceled nor anything the caller could act on: a cancelled ctx
// reported as a generic failure.
func TestCancelAfterDurableFormRefused(t *testing.T) {
	db := databases(t)["sqlite"]
	setup(t, db)
	for _, how := range []string{"Fence", "FenceCall", "Update", "Once"} {
		t.Run(how, func(t *testing.T) {
			c, cancel := context.WithCancel(ctx(t))
			defer cancel()
			q := &cancelAfterFirst{Querier: db, cancel: cancel}
			var err error
			switch how {
			case "Fence":
				err = guard.Fence(c, q, "payment:1001", 5)
			case "FenceCall":
				err = guard.Fence(guard.WithCall(c, "call-5"), q, "payment:1001", 5)
			case "Update":
				err = payments.Update(c, q, 1001, fence.Token(5), "approved_by = $3", "w5")
			case "Once":
				err = guard.Once(c, q, "approve:1001")
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("%s with ctx cancelled after the durable form's refusal: %v, want an error matching context.Canceled", how, err)
			}
		})
	}
}
