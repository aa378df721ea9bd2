package redlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fencekit/fence"
)

// TestStatusNilContext: Status(nil) returns an error matching
// fence.ErrInvalidOption naming Status, as Close(nil) and Acquire(nil) do.
// Before, it panicked: "cannot create context from nil parent", in its
// fan-out's per-node timeout.
func TestStatusNilContext(t *testing.T) {
	l := newLocker(t, nodes(t, 3), nil)
	var noCtx context.Context // nil: the case under test
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("Status(nil) panicked: %v", p)
			}
		}()
		_, err = l.Status(noCtx, "status-nil-ctx")
	}()
	if !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), "Status with a nil context") {
		t.Fatalf("Status(nil) = %v, want an error matching fence.ErrInvalidOption saying 'Status with a nil context'", err)
	}
}
