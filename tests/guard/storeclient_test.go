package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/redis/go-redis/v9"
)

// TestRedisStoreNoClient: a Store without a Client (the zero value, or a
// nil *redis.Client) made Accept dereference nil on the goroutine that
// bounds the call, where no recover reaches: the whole process died
// ("panic: runtime error: invalid memory address or nil pointer
// dereference" in Script.EvalSha), not just the request that an
// http.Server would have recovered from. Accept must return an error
// matching fence.ErrInvalidOption.
func TestRedisStoreNoClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var nilClient *redis.Client
	for _, s := range []redisstore.Store{{}, {Client: nilClient}} {
		for _, c := range []context.Context{ctx, context.Background()} {
			if err := s.Accept(c, "payment:1001", 1); !errors.Is(err, fence.ErrInvalidOption) {
				t.Errorf("Store{Client: %#v}.Accept = %v; want fence.ErrInvalidOption", s.Client, err)
			}
		}
	}
}
