package guard_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/memlock"
)

// TestTransportResendAfterLeaseEnded: net/http's Transport sends a
// replayable request (Idempotency-Key, or an idempotent method) again by
// itself, on a new connection, when the kept-alive one it went out on
// closes before any answer. Here the lease ends while the first copy is at
// the server, which then drops the connection unanswered: the resend waits
// for a new connection after the lease ended, and Transport's doc says it
// refuses to send then. Its check ran only at the first connection
// (GotConn stopped the lease watch), so the resend went out with the
// ended lease's token. A request with a body is refused where net/http
// rewinds it (GetBody), and at the new connection.
func TestTransportResendAfterLeaseEnded(t *testing.T) {
	resendAfterLeaseEnded(t, http.MethodPost)
}

// TestTransportBodylessResendAfterLeaseEnded: the same with a DELETE,
// which has no body to rewind: Transport refuses it at the new connection
// (which it closes, net/http writing an HTTP/1 request on it whatever its
// context says). Before that, the resend went out with the ended lease's
// token.
func TestTransportBodylessResendAfterLeaseEnded(t *testing.T) {
	resendAfterLeaseEnded(t, http.MethodDelete)
}

func resendAfterLeaseEnded(t *testing.T, method string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, "lock:payment:1001", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/warm" {
			return
		}
		if served.Add(1) > 1 {
			return // a resend reached the server
		}
		// The first copy: the lease ends meanwhile (a pause, a failover),
		// and the connection breaks before the answer.
		_, _ = io.Copy(io.Discard, r.Body)
		if err := lease.Release(ctx); err != nil {
			t.Error(err)
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_ = conn.Close()
	}))
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	c := &http.Client{Transport: &guard.Transport{Base: base, Lease: lease}}
	resp, err := c.Get(srv.URL + "/warm") // the next request goes out on a reused connection
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader("approve")
	}
	req, err := http.NewRequestWithContext(ctx, method, srv.URL+"/payments/1001", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "approve-1001")
	resp, err = c.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	t.Logf("%d copies reached the server; Do: %v", served.Load(), err)
	if served.Load() != 1 || !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("the lease ended before net/http's resend: %d copies reached the server, Do = %v; want 1 and an error matching fence.ErrReleased", served.Load(), err)
	}
}
