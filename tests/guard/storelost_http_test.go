package guard_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
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
