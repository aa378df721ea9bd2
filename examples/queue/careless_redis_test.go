package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/silent"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// A stream's Redis that accepts and never answers, reached through a
// client with go-redis's defaults (reads that ignore the context's
// deadline), the lock being on another Redis that answers: Run returns
// within its caller's deadline. Before, each command waited for go-redis's
// own timeouts and retries: Run returned 5 s after a 1 s deadline.
func TestStreamRedisSilentRunReturnsInTime(t *testing.T) {
	locker, err := redislock.New(redistest.Start(t).Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: silent.Addr(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	c := &queue.Consumer{Redis: rdb, DB: pg.NewDB(t), Stream: "s", Group: "g", Name: "c1"}
	const limit = time.Second
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	start := time.Now()
	err = c.Run(ctx, locker)
	if took := time.Since(start); took > limit+time.Second {
		t.Fatalf("Run returned %v after %v, its caller's deadline %v", err, took, limit)
	}
}
