package guard_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestRedisStoreReplicasServerDown: with Replicas, a store whose Redis is
// down (connection refused: nothing was sent) answered "WAIT failed after
// the accept script was sent (the token may be recorded on the primary
// only)", an error matching fence.ErrNotReplicated, so Gate told the
// client 503 not-replicated ("acquire a new lease") for a token nobody
// saw. It must be the connection's error (Gate: 503 store-unavailable,
// try again later), as without Replicas.
func TestRedisStoreReplicasServerDown(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialerRetries: 1})
	defer c.Close()
	store := redisstore.Store{Client: c, Replicas: 1, ReplicaTimeout: 100 * time.Millisecond, ClockTokens: true,
		Prefix: "guardtest:down"}
	srv.Kill()
	err := store.Accept(ctx(t), "payment:1001", 5)
	if err == nil || errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("Accept on a Redis that is down: %v, want the connection's error, not ErrNotReplicated", err)
	}
	ran := 0
	h := guard.Gate(store, guard.HTTPOptions{Resource: oneResource, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ }))
	hs := httptest.NewServer(h)
	defer hs.Close()
	status, p, body := send(t, hs.Client(), hs.URL, guard.TokenHeader, "5")
	if status != http.StatusServiceUnavailable || p.Type != guard.ProblemStore || ran != 0 {
		t.Fatalf("Gate on a Redis that is down: %d %q (ran %d), want 503 %s; body %s", status, p.Type, ran, guard.ProblemStore, body)
	}
}
