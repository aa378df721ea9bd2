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

// tracedClient is a careless user's client wrapper (tracing, metrics): it
// embeds the go-redis client it wraps.
type tracedClient struct{ *redis.Client }

// TestRedisStoreWrapperNilClient: a wrapper whose embedded client is nil
// (a tracing wrapper built before the client was) is not a nil pointer, so
// Accept's nil check lets it through; the call then panics on the
// goroutine that bounds it (the context has a deadline), where no recover
// can reach it, and the whole process died ("panic: runtime error: invalid
// memory address or nil pointer dereference" in go-redis's Pipeline/EvalSha).
// It must be an error instead, with or without a deadline.
func TestRedisStoreWrapperNilClient(t *testing.T) {
	for _, s := range []redisstore.Store{
		{Client: tracedClient{}},
		{Client: tracedClient{}, Replicas: 1},
		{Client: tracedClient{}, ClockTokens: true},
	} {
		dl, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.Accept(dl, "payment:1001", 5)
		cancel()
		if !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("%+v with a deadline: %v, want fence.ErrInvalidOption", s, err)
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%+v without a deadline: panic %v, want an error", s, r)
				}
			}()
			if err := s.Accept(context.Background(), "payment:1001", 5); !errors.Is(err, fence.ErrInvalidOption) {
				t.Errorf("%+v without a deadline: %v, want fence.ErrInvalidOption", s, err)
			}
		}()
	}
}
