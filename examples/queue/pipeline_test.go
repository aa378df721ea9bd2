package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/memlock"
	"github.com/redis/go-redis/v9"
)

// TestRunOnPipelineRefused: a go-redis pipeline is a redis.Cmdable, so it
// fits Consumer.Redis, but it only queues the commands given to it, each
// "succeeding" with an empty reply. A Consumer given one led and then
// spun: no XREADGROUP ever blocked, nothing was read or logged after
// "elected", and the pipeline grew by every command sent (52,496 queued
// in 1 s) until Run's context ended. It must fail at once with
// fence.ErrInvalidOption, as for a nil Redis.
func TestRunOnPipelineRefused(t *testing.T) {
	locker, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Start(t).Client(t)
	for name, p := range map[string]redis.Pipeliner{"Pipeline": rdb.Pipeline(), "TxPipeline": rdb.TxPipeline()} {
		c := &queue.Consumer{Redis: p, DB: pg.NewDB(t), Stream: "s", Group: "g", Name: "n"}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err := c.Run(ctx, locker)
		cancel()
		if !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
}

// TestRunOnWrappedPipelineRefused: a pipeline behind a wrapper that
// embeds redis.Cmdable (a tracing or metrics wrapper, say) is not a
// redis.Pipeliner to a type assertion, and Run took it for a client: it
// led and spun, reading nothing, until its context ended ("Pipeline:
// context deadline exceeded, want ErrInvalidOption", and TxPipeline). It
// must be refused as a bare pipeline is.
func TestRunOnWrappedPipelineRefused(t *testing.T) {
	locker, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Start(t).Client(t)
	type wrapper struct{ redis.Cmdable }
	for name, p := range map[string]redis.Pipeliner{"Pipeline": rdb.Pipeline(), "TxPipeline": rdb.TxPipeline()} {
		c := &queue.Consumer{Redis: wrapper{p}, DB: pg.NewDB(t), Stream: "s", Group: "g", Name: "n"}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err := c.Run(ctx, locker)
		cancel()
		if !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
}
