// Package nilctx words the error every Locker and Lease returns when it is
// called with a nil context.Context: a bad argument, reported as one
// (matching fence.ErrInvalidOption) before the call does anything, never a
// panic that takes a program down over the caller's mistake.
//
// The check itself stays in the caller, a nil comparison on the hot path:
//
//	if ctx == nil {
//		return nilctx.Err("redislock", "Acquire")
//	}
package nilctx

import (
	"fmt"

	"github.com/fencekit/fence"
)

// Err returns the error of pkg's method called with a nil ctx, worded as
// the Lockers' Close(nil) first was: "redlock: fence: invalid option:
// Close with a nil context". It matches fence.ErrInvalidOption.
func Err(pkg, method string) error {
	return fmt.Errorf("%s: %w: %s with a nil context", pkg, fence.ErrInvalidOption, method)
}
