// Package pause is the back-off the lock packages' retry loops share: how
// long (Backoff), the wait that ends early with the caller's context
// (For), and a retry loop of that shape (Retry).
package pause

import (
	"context"
	"math/rand/v2"
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

// Backoff is the pause before the next try after n failures in a row (n
// from 1): 10 ms doubling to 1 s, jittered by up to a half, so that the
// waiters of many processes do not return to a recovering server in step.
func Backoff(n int) time.Duration {
	d := min(10*time.Millisecond<<min(n-1, 7), time.Second)
	return d/2 + rand.N(d/2+1)
}

// Retry retries a call whose first try failed with err: it calls again
// after 10 ms, doubling up to 1 s between calls, until a call returns nil
// or an error that final reports, or ctx ends; it returns the last error.
// fence.Run's Release and fence exec's share it.
func Retry(ctx context.Context, err error, again func() error, final func(error) bool) error {
	for wait := 10 * time.Millisecond; err != nil && !final(err) && For(ctx, wait); wait = min(2*wait, time.Second) {
		err = again()
	}
	return err
}
