package pglock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fencekit/fence"
)

// TestEnsureSchemaNilContext: EnsureSchema(nil) returns an error matching
// fence.ErrInvalidOption naming EnsureSchema, as Acquire(nil) does, and
// sends nothing. Before, it never returned: the test ran 10 minutes
// until go test's timeout and a SIGQUIT ended it.
func TestEnsureSchemaNilContext(t *testing.T) {
	d := newDatabase(t, pg)
	l := d.locker(t, d.db)
	var noCtx context.Context // nil: the case under test
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("EnsureSchema(nil) panicked: %v", p)
			}
		}()
		err = l.EnsureSchema(noCtx)
	}()
	if !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), "EnsureSchema with a nil context") {
		t.Fatalf("EnsureSchema(nil) = %v, want an error matching fence.ErrInvalidOption saying 'EnsureSchema with a nil context'", err)
	}
}
