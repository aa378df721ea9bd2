package zklock

import "context"

// bounded runs call, which cannot be cancelled (go-zookeeper's calls take no
// context), and returns its result, or ctx's error as soon as ctx is done.
// A call given up on finishes in the background; abandoned, if not nil,
// then gets its result, to undo what it did. go-zookeeper ends every call
// when its connection closes, so none outlives the connection.
func bounded[T any](ctx context.Context, call func() (T, error), abandoned func(T, error)) (T, error) {
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
