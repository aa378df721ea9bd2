package fence_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fencekit/fence"
)

// ctxReader is a Locker of someone else's that reads its ctx first thing,
// as most do, and so panics on a nil one.
type ctxReader struct{}

func (ctxReader) Acquire(ctx context.Context, name string, _ ...fence.Option) (fence.Lease, error) {
	return nil, fence.NotAcquired(name, ctx.Err())
}

// TestRunLeadNilContext: Run and Lead refuse a nil ctx themselves, with an
// error matching fence.ErrInvalidOption naming them, rather than pass it
// to a Locker that may not check for it. Before, both panicked: "runtime
// error: invalid memory address or nil pointer dereference".
func TestRunLeadNilContext(t *testing.T) {
	var noCtx context.Context // nil: the case under test
	fn := func(context.Context, fence.Lease) error { return nil }
	for what, call := range map[string]func() error{
		"Run":  func() error { return fence.Run(noCtx, ctxReader{}, "x", fn) },
		"Lead": func() error { return fence.Lead(noCtx, ctxReader{}, "x", fn) },
	} {
		t.Run(what, func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("%s(nil) panicked: %v", what, p)
					}
				}()
				err = call()
			}()
			if !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), what+" with a nil context") {
				t.Fatalf("%s(nil) = %v, want an error matching fence.ErrInvalidOption saying '%s with a nil context'", what, err, what)
			}
		})
	}
}
