// Package bound waits for a call that takes no context only as long as a
// context lasts.
package bound

import "context"

// Call runs call, which cannot be cancelled, and returns its result, or
// ctx's error as soon as ctx is done. A call given up on finishes in the
// background; abandoned, if not nil, then gets its result, to undo what it
// did.
func Call[T any](ctx context.Context, call func() (T, error), abandoned func(T, error)) (T, error) {
	if ctx.Done() == nil {
		return call()
	}
	type result struct {
		v   T
		err error
	}
	if err := ctx.Err(); err != nil {
		var zero T
		return zero, err
	}
	ch := make(chan result)
	quit := make(chan struct{})
	go func() {
		v, err := call()
		select {
		case ch <- result{v, err}:
		case <-quit:
			if abandoned != nil {
				abandoned(v, err)
			}
		}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		close(quit)
		var zero T
		return zero, ctx.Err()
	}
}
