package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
)

// Names holding the invisible characters fence.ValidateName refuses: a
// stream is refused with fence.ErrInvalidName, a message id with
// ErrInvalidID (its guard resource would be such a name), and nothing is
// appended.
func TestInvisibleCharactersRefused(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, s := range []string{"\ufefforders", "orders\u200b", "ord\u202eers", "orders\u2060"} {
		if _, err := queue.ProduceID(ctx, rdb, s, "m1", "a", 1); !errors.Is(err, fence.ErrInvalidName) || errors.Is(err, queue.ErrInvalidID) {
			t.Errorf("ProduceID to stream %q: %v, want fence.ErrInvalidName (and not ErrInvalidID)", s, err)
		}
		if _, err := queue.ProduceID(ctx, rdb, "orders", s, "a", 1); !errors.Is(err, queue.ErrInvalidID) || !errors.Is(err, fence.ErrInvalidName) {
			t.Errorf("ProduceID of id %q: %v, want ErrInvalidID wrapping fence.ErrInvalidName", s, err)
		}
	}
	if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE = %d, %v after refused calls; want nothing written", n, err)
	}
}
