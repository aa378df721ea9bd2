package zklock

import (
	"context"

	"github.com/fencekit/fence/internal/bound"
)

// bounded runs call, which cannot be cancelled (go-zookeeper's calls take no
// context), and returns its result, or ctx's error as soon as ctx is done
// (bound.Call). go-zookeeper ends every call when its connection closes, so
// none outlives the connection.
func bounded[T any](ctx context.Context, call func() (T, error), abandoned func(T, error)) (T, error) {
	return bound.Call(ctx, call, abandoned)
}
