package lab

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/cmd/fence/lab/worker"
	"github.com/fencekit/fence/internal/nilctx/nilctxtest"
)

// TestNilContext: Run, BuildWorker and the worker's store calls that take
// a ctx return an error matching fence.ErrInvalidOption for a nil one,
// naming the call, as fence's Lockers and guard do, before they start,
// build or write anything. Before, BuildWorker panicked ('nil Context',
// from exec.CommandContext), EnsureRow with a nil dereference (in
// database/sql, which then holds its DB's lock for good), WriteIn passed
// it on to EnsureRow's statement, and Run
// started scenario 1's servers before guard refused the nil ctx
// ('scenario 1 (paused holder): guard: fence: invalid option:
// CreateIfNotExists with a nil context'; guard's own calls panicked
// before guard checked).
func TestNilContext(t *testing.T) {
	var noCtx context.Context // nil: the case under test
	db, err := worker.OpenDB(filepath.Join(t.TempDir(), "r.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	op := worker.Op{ID: "o1", Worker: "w1", Key: "p", Token: 5}
	for _, c := range []struct {
		what string
		call func() error
	}{
		{"Run", func() error {
			_, err := Run(noCtx, Config{Worker: []string{filepath.Join(t.TempDir(), "none")}, Scenarios: []int{1}, Quick: true})
			return err
		}},
		{"BuildWorker", func() error { _, err := BuildWorker(noCtx, t.TempDir()); return err }},
		{"CreateSchema", func() error { return worker.CreateSchema(noCtx, db) }},
		{"EnsureRow", func() error { return worker.EnsureRow(noCtx, db, "p") }},
		{"Apply", func() error { _, _, err := worker.Apply(noCtx, db, worker.WriteGuard, op, nil); return err }},
		{"WriteIn", func() error {
			tx, err := db.BeginTx(context.Background(), nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			_, _, err = worker.WriteIn(noCtx, tx, op)
			return err
		}},
	} {
		err := nilCtxErr(c.call)
		if !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), c.what+" with a nil context") {
			t.Errorf("%s(nil) = %v, want an error matching fence.ErrInvalidOption saying '%s with a nil context'", c.what, err, c.what)
		}
	}
}

// nilCtxErr is nilctxtest.Call.
var nilCtxErr = nilctxtest.Call
