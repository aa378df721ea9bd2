package redislock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
)

// TestNilContext: the Locker's own methods that take a ctx return an error
// matching fence.ErrInvalidOption for a nil one, naming the method, as
// Acquire and the lease's methods do (fencetest's NilContext). Before,
// Status, ReplicaCounts and SetExpectedReplicas panicked with a nil
// pointer dereference, and WaitGiveBacks returned nil with no give-back
// pending (with one pending it would have panicked on ctx.Done()).
func TestNilContext(t *testing.T) {
	srv := redistest.Start(t)
	l := newLocker(t, srv.Client(t))
	var noCtx context.Context // nil: the case under test
	for method, call := range map[string]func() error{
		"Status":              func() error { _, err := l.Status(noCtx, "x"); return err },
		"ReplicaCounts":       func() error { _, err := l.ReplicaCounts(noCtx, "x"); return err },
		"SetExpectedReplicas": func() error { return l.SetExpectedReplicas(noCtx, "x", 1) },
		"WaitGiveBacks":       func() error { return l.WaitGiveBacks(noCtx) },
	} {
		t.Run(method, func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("%s(nil) panicked: %v", method, p)
					}
				}()
				err = call()
			}()
			if !errors.Is(err, fence.ErrInvalidOption) {
				t.Fatalf("%s(nil) = %v, want an error matching fence.ErrInvalidOption", method, err)
			}
			if want := method + " with a nil context"; !strings.Contains(err.Error(), want) {
				t.Fatalf("%s(nil) = %q, want it to say %q", method, err, want)
			}
		})
	}
}
