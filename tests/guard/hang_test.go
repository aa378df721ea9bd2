package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
)

// TestRedisStoreHungServerWithinDeadline pauses the Redis server behind a
// redisstore.Store (SIGSTOP) and asks it to accept a token with a context
// that ends after 200 ms, on a client with go-redis's default options
// (ContextTimeoutEnabled off, ReadTimeout 3 s). Accept must return by the
// context's end, with its error, as redislock's calls do: a gate in front of
// a request must not hold it for the client's socket timeout, nor for ever
// when the client sets none. The same for a cancellation without deadline.
func TestRedisStoreHungServerWithinDeadline(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	store := redisstore.Store{Client: client}
	if err := store.Accept(ctx(t), "hung", 1); err != nil { // a pooled connection, warm
		t.Fatal(err)
	}
	resume := srv.Pause(t)
	defer resume()

	const wait = 200 * time.Millisecond
	const slack = 800 * time.Millisecond
	check := func(name string, c context.Context, want error) {
		t.Helper()
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- store.Accept(c, "hung", 2) }()
		timer := time.NewTimer(wait + slack)
		defer timer.Stop()
		select {
		case err := <-done:
			took := time.Since(start)
			if took > wait+slack || !errors.Is(err, want) || errors.Is(err, guard.ErrStale) {
				t.Errorf("%s: Accept on a hung server returned %v after %v; want %v within %v", name, err, took, want, wait+slack)
			}
		case <-timer.C:
			t.Errorf("%s: Accept on a hung server still running after %v (context ended after %v)", name, wait+slack, wait)
			<-done
		}
	}

	dctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	check("deadline", dctx, context.DeadlineExceeded)

	cctx, cancelNow := context.WithCancel(context.Background())
	stop := time.AfterFunc(wait, cancelNow)
	defer stop.Stop()
	check("cancel", cctx, context.Canceled)
}
