package guard_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/redistest"
)

// TestGateStoreLostAndNotReplicated: Gate answers a token refused by the
// store's floor, and one not confirmed by replicas, 503 with a problem
// type of its own (the client acquires a new lease and tries again), not
// 409 stale (a newer holder exists) nor a plain store-unavailable.
func TestGateStoreLostAndNotReplicated(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&guard.StoreLostError{Resource: "r", Token: 5, Floor: 9}, guard.ProblemStoreLost},
		{errors.Join(errors.New("redisstore: accept"), &fence.NotReplicatedError{Acked: 0, Required: 1}), guard.ProblemNotReplicated},
	} {
		ran := 0
		h := guard.Gate(acceptorFunc(func(context.Context, string, fence.Token) error { return tc.err }),
			guard.HTTPOptions{Resource: oneResource, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ }))
		srv := httptest.NewServer(h)
		status, p, body := send(t, srv.Client(), srv.URL, guard.TokenHeader, "5")
		srv.Close()
		if status != http.StatusServiceUnavailable || p.Type != tc.want || ran != 0 {
			t.Errorf("store error %v: %d %q (handler ran %d times), want 503 %s, not run; body %s", tc.err, status, p.Type, ran, tc.want, body)
		}
	}
}

type acceptorFunc func(context.Context, string, fence.Token) error

func (f acceptorFunc) Accept(ctx context.Context, resource string, token fence.Token) error {
	return f(ctx, resource, token)
}

// TestGateRedisStoreFloor: Gate over a real redisstore.Store with
// ClockTokens: a token issued before the store's floor (its first use,
// or after its Redis lost its state) is answered 503 store-lost, the
// handler not run, and a token issued after it is admitted.
func TestGateRedisStoreFloor(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	store := clockStore(c)
	ran := 0
	h := guard.Gate(store, guard.HTTPOptions{Resource: oneResource, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ }))
	hs := httptest.NewServer(h)
	defer hs.Close()
	before := serverMicros(t, c)
	if status, p, body := send(t, hs.Client(), hs.URL, guard.TokenHeader, strconv.FormatInt(int64(before), 10)); status != http.StatusServiceUnavailable || p.Type != guard.ProblemStoreLost || ran != 0 {
		t.Fatalf("token issued before the floor: %d %q, handler ran %d times; want 503 %s; body %s", status, p.Type, ran, guard.ProblemStoreLost, body)
	}
	after := serverMicros(t, c) + 10
	if status, _, body := send(t, hs.Client(), hs.URL, guard.TokenHeader, strconv.FormatInt(int64(after), 10)); status != http.StatusOK || ran != 1 {
		t.Fatalf("token issued after the floor: %d, handler ran %d times; want 200, run; body %s", status, ran, body)
	}
}
