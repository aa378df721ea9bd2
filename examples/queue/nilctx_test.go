package queue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/nilctx/nilctxtest"
	"github.com/fencekit/fence/redislock"
)

// TestNilContext: every call of the package that takes a ctx returns an
// error matching fence.ErrInvalidOption for a nil one, naming it, as
// fence's Lockers and guard do, and appends or applies nothing. Before,
// CreateSchema and Consumer.Run panicked ('runtime error: invalid memory
// address or nil pointer dereference'), and Produce and ProduceID as well.
func TestNilContext(t *testing.T) {
	ctx, rdb, db := servers(t, 30*time.Second)
	locker, err := redislock.New(rdb, nil)
	if err != nil {
		t.Fatal(err)
	}
	var noCtx context.Context // nil: the case under test
	c := &queue.Consumer{Redis: rdb, DB: db, Stream: "s", Group: "g", Name: "c1"}
	for _, call := range []struct {
		what string
		call func() error
	}{
		{"CreateSchema", func() error { return queue.CreateSchema(noCtx, db) }},
		{"Produce", func() error { _, err := queue.Produce(noCtx, rdb, "s", "alice", 5); return err }},
		{"ProduceID", func() error { _, err := queue.ProduceID(noCtx, rdb, "s", "m1", "alice", 5); return err }},
		{"Consumer.Run", func() error { return c.Run(noCtx, locker) }},
	} {
		err := nilCtxErr(call.call)
		if !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), call.what+" with a nil context") {
			t.Errorf("%s(nil) = %v, want an error matching fence.ErrInvalidOption saying '%s with a nil context'", call.what, err, call.what)
		}
	}
	if n, err := rdb.Exists(ctx, "s").Result(); err != nil || n != 0 {
		t.Errorf("stream s after the calls with a nil ctx: exists %d, %v; want none", n, err)
	}
}

// nilCtxErr is nilctxtest.Call.
var nilCtxErr = nilctxtest.Call
