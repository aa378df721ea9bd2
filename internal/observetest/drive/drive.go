// Package drive drives the events that the tests of fence.Observer's
// adapters (fenceprom, fenceotel) count, against a real redis-server.
package drive

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// Events reports to obs, through redislock and guard on a real redis-server:
// a lease lost behind its holder's back (its key deleted), a replica-sync
// refusal (one replica expected, none connected), and a fresh and a stale
// write to the resource "payment:1001" through guard.Middleware. In all:
// Acquire acquired 2 and not_replicated 1; leases ended removed 1 and
// released 1; one refusal {acked 0, required 1}; guard accept 1, reject 1.
// The lost lease's end is reported just after its Done closes: callers
// poll for it.
func Events(t testing.TB, obs fence.Observer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := redistest.Start(t).Client(t)
	// 2 s: long enough that a slow round trip does not lose the lease
	// before the key is deleted; its watchdog notices the deletion within
	// a third of it.
	locker, err := redislock.New(c, &redislock.Options{WatchdogTTL: 2 * time.Second, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}

	// A lost lease: the key deleted behind the holder's back.
	stale, err := locker.Acquire(ctx, "lock:payment:1001")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx, "fence:{lock:payment:1001}").Err(); err != nil {
		t.Fatal(err)
	}
	<-stale.Done()

	// A refusal: one replica expected, none connected.
	strict, err := redislock.New(c, &redislock.Options{Observer: obs,
		ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strict.Acquire(ctx, "lock:payment:1001", fence.TTL(time.Minute)); !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("Acquire with the expected replica missing: %v", err)
	}

	// The new holder writes; the old one comes back with its stale token.
	fresh, err := locker.Acquire(ctx, "lock:payment:1001", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	h := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{
		Resource: func(r *http.Request) (string, error) { return "payment:" + r.PathValue("id"), nil },
		Observer: obs,
	})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	mux := http.NewServeMux()
	mux.Handle("POST /payments/{id}", h)
	for _, tc := range []struct {
		lease fence.Lease
		code  int
	}{{fresh, http.StatusOK}, {stale, http.StatusConflict}} {
		req := httptest.NewRequest(http.MethodPost, "/payments/1001", nil)
		req.Header.Set(guard.TokenHeader, fmt.Sprint(int64(tc.lease.Token())))
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		if w.Code != tc.code {
			t.Fatalf("token %d: %d, want %d", tc.lease.Token(), w.Code, tc.code)
		}
	}
	if err := fresh.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
