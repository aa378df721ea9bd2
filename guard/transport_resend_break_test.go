package guard_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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
// ended lease's token. A request with a body is now refused where net/http
// rewinds it (GetBody). A body-less one (a DELETE with an Idempotency-Key)
// is still resent, net/http having no hook before the write: see
// TestTransportBodylessResendAfterLeaseEnded for why that is harmless.
func TestTransportResendAfterLeaseEnded(t *testing.T) {
	resendAfterLeaseEnded(t, http.MethodPost)
}

// TestTransportBodylessResendAfterLeaseEnded: the same with a DELETE,
// which has no body to rewind: net/http may resend it with the ended
// lease's token, and Transport has no hook before the write to refuse it
// at. The resend carries the first copy's Fence-Call, so it is harmless
// at a fenced server: it is refused if a newer token was accepted,
// answered as a replay if the first copy was applied (here: the first copy
// committed, then the lease ended and the connection broke before the
// answer), and otherwise applied once, as the first copy would have been.
// What must hold: the write is applied once; the caller gets either the
// lease's end (the resend refused by Transport) or the replay, never 409.
func TestTransportBodylessResendAfterLeaseEnded(t *testing.T) {
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
	var applied, served atomic.Int32
	var mu sync.Mutex
	var copies []string // each copy's token and call id
	fenced := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{Resource: func(*http.Request) (string, error) { return "payment:1001", nil }})(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { applied.Add(1) }))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/warm" {
			return
		}
		mu.Lock()
		copies = append(copies, r.Header.Get(guard.TokenHeader)+" "+r.Header.Get(guard.CallHeader))
		mu.Unlock()
		if served.Add(1) > 1 {
			fenced.ServeHTTP(w, r) // a resend reached the server
			return
		}
		// The first copy is applied; the lease ends (a pause, a failover),
		// and the connection breaks before the answer.
		fenced.ServeHTTP(httptest.NewRecorder(), r)
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

	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, srv.URL+"/payments/1001", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "delete-1001") // replayable: net/http resends it
	resp, err = c.Do(req)
	status, replayed := 0, ""
	if err == nil {
		status, replayed = resp.StatusCode, resp.Header.Get(guard.ReplayedHeader)
		resp.Body.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("copies (token call) %q, applied %d; Do: %d %q, %v", copies, applied.Load(), status, replayed, err)
	if applied.Load() != 1 {
		t.Fatalf("applied %d times; want once", applied.Load())
	}
	for _, c := range copies[1:] {
		if c != copies[0] {
			t.Fatalf("copies (token call) %q: a resend is not the same call", copies)
		}
	}
	switch {
	case len(copies) == 1 && errors.Is(err, fence.ErrReleased):
	case len(copies) == 2 && err == nil && status == http.StatusOK && replayed == "true":
	default:
		t.Fatalf("%d copies reached the server, Do = %d (Fence-Replayed %q), %v; want 1 and fence.ErrReleased, or 2 and a 200 replay", len(copies), status, replayed, err)
	}
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
