package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/nilctx/nilctxtest"
	"github.com/redis/go-redis/v9"
)

// noCtx is the nil context under test, a variable so that the calls read
// as what they are.
var noCtx context.Context

// nilCtxErr runs call, which was given a nil ctx, and returns its error,
// or one that says it panicked or had not returned (nilctxtest.Call).
func nilCtxErr(t *testing.T, what string, call func() error) error {
	t.Helper()
	return nilctxtest.Call(call)
}

// TestNilContext: every guard call that takes a ctx returns an error
// matching fence.ErrInvalidOption for a nil one, on both databases, as the
// Lockers do, before it touches the database. Before, every one of them
// panicked ('runtime error: invalid memory address or nil pointer
// dereference', or 'cannot create context from nil parent' from
// SQLStore.Do and Tx).
func TestNilContext(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			noop := func(*sql.Tx) error { return nil }
			fn := func(context.Context) error { return nil }
			for _, c := range []struct {
				what string
				call func() error
			}{
				{"CreateTables", func() error { return guard.CreateTables(noCtx, db) }},
				{"CreateIfNotExists", func() error {
					return guard.CreateIfNotExists(noCtx, db, "CREATE TABLE IF NOT EXISTS nilctx (a INT)")
				}},
				{"Fence", func() error { return guard.Fence(noCtx, db, "payment:1001", 5) }},
				{"Tx", func() error { return guard.Tx(noCtx, db, "payment:1001", 5, noop) }},
				{"Once", func() error { return guard.Once(noCtx, db, "approve:1001") }},
				{"Table.Update", func() error { return payments.Update(noCtx, db, 1001, 5, "status = $3", "APPROVED") }},
				{"Table.UpdateVersion", func() error {
					return payments.UpdateVersion(noCtx, db, 1001, 0, "status = $3", "APPROVED")
				}},
				{"SQLStore.Do", func() error { return guard.SQLStore{DB: db}.Do(noCtx, "payment:1001", 5, fn) }},
				{"MemoryStore.Do", func() error { return new(guard.MemoryStore).Do(noCtx, "payment:1001", 5, fn) }},
			} {
				err := nilCtxErr(t, c.what, c.call)
				if !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), c.what+" with a nil context") {
					t.Errorf("%s(nil) = %v, want an error matching fence.ErrInvalidOption saying '%s with a nil context'", c.what, err, c.what)
				}
			}
			// Nothing was written: token 5 is still new to payment:1001.
			if err := guard.Fence(ctx(t), db, "payment:1001", 5); err != nil {
				t.Fatalf("Fence 5 after the calls with a nil ctx: %v", err)
			}
		})
	}
}

// TestRedisStoreNilContext: redisstore.Store.Accept with a nil ctx
// returns an error matching fence.ErrInvalidOption and records nothing.
// Before, it panicked ('runtime error: invalid memory address or nil
// pointer dereference', in guard.CallFrom).
func TestRedisStoreNilContext(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = client.Close() })
	s := redisstore.Store{Client: client, Prefix: "guardtest:nilctx:" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	err := nilCtxErr(t, "Accept", func() error { return s.Accept(noCtx, "payment:1001", 5) })
	if !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), "Accept with a nil context") {
		t.Errorf("Accept(nil) = %v, want an error matching fence.ErrInvalidOption saying 'Accept with a nil context'", err)
	}
	if err := s.Accept(ctx(t), "payment:1001", 5); err != nil {
		t.Fatalf("Accept 5 after Accept(nil) of 5: %v", err)
	}
}

// TestCallFromNilContext: CallFrom and TxFrom read a nil ctx as one
// without a call id or fenced transaction, as they read a ctx that has
// none. Before, both panicked ('runtime error: invalid memory address or
// nil pointer dereference').
func TestCallFromNilContext(t *testing.T) {
	err := nilCtxErr(t, "CallFrom", func() error {
		if call := guard.CallFrom(noCtx); call != "" {
			return errors.New("call id " + strconv.Quote(call))
		}
		if tx, ok := guard.TxFrom(noCtx); tx != nil || ok {
			return errors.New("a fenced transaction")
		}
		return nil
	})
	if err != nil {
		t.Errorf("CallFrom(nil), TxFrom(nil): %v, want none", err)
	}
}

// TestWithCallNilContext: WithCall(nil, id) panics, as context.WithValue
// does ('cannot create context from nil parent'), as its doc says: it
// returns a context, not an error, and replacing a nil ctx with
// context.Background would drop the caller's deadline unseen.
func TestWithCallNilContext(t *testing.T) {
	defer func() {
		if r := recover(); r == nil {
			t.Error("WithCall(nil, \"c1\") did not panic")
		}
	}()
	_ = guard.WithCall(noCtx, "c1")
}
