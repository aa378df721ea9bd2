package guard_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fencekit/fence/guard"
)

// TestSeeOtherAfterWriteThroughTransport: a handler behind Middleware over
// SQLStore writes and answers a fenced POST with 303 See Other to the
// payment's page (the answer the Middleware doc calls usual after a POST
// that succeeded; TestRedirectAfterWriteCommits), and that page is served
// behind the same Middleware, on the same resource (Middleware wrapping the
// whole mux, a chooser that takes the payment's id from the path). The
// client, an http.Client through guard.Transport, follows the 303 with a
// GET that carries the same token and a new call id: the server answers it
// 409 stale ("this fencing token was already used for another call"), and
// that 409 is what the caller's Do returns, for a write that committed.
// Before: POST answered 409, state 5 (the write committed).
func TestSeeOtherAfterWriteThroughTransport(t *testing.T) {
	t.Skip("design question: http.Client follows a 303 (and a 301 or 302 after a POST) with a GET to the Location, " +
		"and guard.Transport gives it the lease's token, spent by the POST, under a new call id; Middleware, fencing the page " +
		"on the same resource, answers 409 stale, and the caller is told its committed write was refused. " +
		"Transport cannot stop the follow-up without failing Do (the 303's answer lost with it), nor send it without a token " +
		"(400); Middleware cannot tell a follow-up GET from a stale holder's. Options: Transport's doc tells callers to set " +
		"CheckRedirect to http.ErrUseLastResponse for 303, or Middleware lets a safe method (GET, HEAD) with the last token " +
		"read without spending it (a fenced read then no longer orders anything)")
	s := stateStores(t)["sql-postgres"]
	mw := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource, Namespace: "http303:"})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments/1001/approve", func(w http.ResponseWriter, r *http.Request) {
		if err := s.write(r, 5); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		http.Redirect(w, r, "/payments/1001", http.StatusSeeOther)
	})
	mux.HandleFunc("GET /payments/1001", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "approved")
	})
	srv := httptest.NewServer(mw(mux))
	defer srv.Close()
	c := &http.Client{Transport: &guard.Transport{Base: srv.Client().Transport, Lease: memLease(t, "lock:payment:1001")}}
	resp, err := c.Post(srv.URL+"/payments/1001/approve", "text/plain", strings.NewReader("approve"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST answered %d (%q), state %d (the write committed)", resp.StatusCode, strings.TrimSpace(string(body)), s.read(t))
	}
}
