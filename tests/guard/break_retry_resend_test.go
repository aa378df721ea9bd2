package guard_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fence/guard"
)

// TestTransportSilentResendAfterCommit: net/http's Transport sends a
// request again, by itself, when the kept-alive connection it was sent on
// closes before any answer, if the request is replayable: an idempotent
// method, or an Idempotency-Key (or X-Idempotency-Key) header, with a body
// it can rewind. Here the server commits the fenced write and the
// connection then breaks before the answer (a proxy or the server process
// cut it): the resend, with the same token, finds its own token accepted.
// What must hold: the write is applied once, never twice, and the caller
// is not told 409 stale for the write it made. Before call ids it was
// (Problem.Last equal to its own token, as if a newer holder had taken
// over); now the resend carries the same Fence-Call, the store finds it
// the call it accepted, and the answer is 200 with Fence-Replayed.
func TestTransportSilentResendAfterCommit(t *testing.T) {
	for name, s := range stateStores(t) {
		t.Run(name, func(t *testing.T) {
			var applied, served atomic.Int32
			var calls [2]atomic.Value // the Fence-Call of the first two copies
			mw := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource})
			fenced := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				applied.Add(1)
				if err := s.write(r, int64(applied.Load())); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
				}
			}))
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/warm" {
					return
				}
				n := served.Add(1)
				if n <= 2 {
					calls[n-1].Store(r.Header.Get(guard.CallHeader))
				}
				if n > 1 {
					fenced.ServeHTTP(w, r)
					return
				}
				// The first fenced request: committed, then its connection
				// breaks before the answer.
				rec := httptest.NewRecorder()
				fenced.ServeHTTP(rec, r)
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
			c := &http.Client{Transport: &guard.Transport{Base: base, Lease: memLease(t, "lock:payment:1001")}}
			resp, err := c.Get(srv.URL + "/warm") // the connection is now a reused one
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()

			req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+"/payments/1001", strings.NewReader("approve"))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Idempotency-Key", "approve-1001")
			resp, err = c.Do(req)
			status, replayed := 0, ""
			if err == nil {
				status, replayed = resp.StatusCode, resp.Header.Get(guard.ReplayedHeader)
				resp.Body.Close()
			}
			t.Logf("fenced POST: %d requests reached the server, handler ran %d times, state %d; client got %d, %v", served.Load(), applied.Load(), s.read(t), status, err)
			if applied.Load() != 1 || s.read(t) != 1 {
				t.Fatalf("the write was applied %d times (state %d); want once", applied.Load(), s.read(t))
			}
			if served.Load() < 2 {
				t.Fatalf("net/http did not resend the request (%d reached the server): the test did not test resends", served.Load())
			}
			if first, second := calls[0].Load(), calls[1].Load(); first == "" || first != second {
				t.Errorf("Fence-Call of the first copy %q, of net/http's resend %q; want one non-empty id", first, second)
			}
			if err != nil || status != http.StatusOK || replayed != "true" {
				t.Fatalf("the resend of an applied call: %d (Fence-Replayed %q), %v; want 200 with Fence-Replayed: true, not 409 stale", status, replayed, err)
			}
		})
	}
}
