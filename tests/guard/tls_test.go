package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestRedisStoreTLS: one round of redisstore.Store.Accept on a go-redis
// client over TLS to a redis-server that speaks TLS alone: a token is
// accepted, a smaller one and the same one are stale, a larger one is
// accepted.
func TestRedisStoreTLS(t *testing.T) {
	srv := redistest.StartTLS(t, redistest.NewTLS(t))
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, TLSConfig: srv.TLSConfig()})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store := redisstore.Store{Client: c}
	for _, step := range []struct {
		token int64
		stale bool
	}{{7, false}, {6, true}, {7, true}, {8, false}} {
		err := store.Accept(ctx, "payment:1001", fence.Token(step.token))
		if step.stale != errors.Is(err, guard.ErrStale) || (!step.stale && err != nil) {
			t.Fatalf("Accept(%d) over TLS = %v, want stale %v", step.token, err, step.stale)
		}
	}
}
