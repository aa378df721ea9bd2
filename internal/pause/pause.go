// Package pause waits out a back-off unless the caller's context ends
// first: the one wait the lock packages' retry loops share.
package pause

import (
	"context"
	"time"
)

// For waits d, or less if ctx ends first; it reports whether d passed.
func For(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
