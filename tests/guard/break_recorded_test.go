package guard_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/fencekit/fence/guard"
)

// Fence-Recorded-Call sent by a client of its own, not by Transport.

// TestRecordedCallDoesNotCoverAnotherWrite: a client other than Transport
// (a script, another language's client) sends a fenced POST with Fence-Call
// C, which the handler applies and answers 303 with the Fence-Recorded-Call
// the store recorded it under; then, with the same token and C, a POST of
// another body, a DELETE and a PUT, each carrying that Fence-Recorded-Call.
// Fence-Call's digest covers method, target and body so that a different
// request under one call id is not told it was applied; the recorded id was
// handed to the store as it was, whatever the request: before, each of the
// three writes was answered as the applied call (Middleware over
// MemoryStore, SQLStore on PostgreSQL and on SQLite: 200 Fence-Replayed:
// true; Gate over redisstore: 409 Fence-Replayed: admitted), and none ran.
// Only a GET or HEAD, what http.Client sends after a 301, 302 or 303, is a
// follow-up now: a write is answered as without the header (409 stale;
// Gate, whose digest leaves the body out, admitted for the POST of another
// body), and the GET is still the applied call.
func TestRecordedCallDoesNotCoverAnotherWrite(t *testing.T) {
	for name, mw := range guards(t, guard.HTTPOptions{Resource: oneResource}) {
		t.Run(name, func(t *testing.T) {
			var mu sync.Mutex
			var ran []string
			srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				mu.Lock()
				ran = append(ran, r.Method+" "+r.URL.Path+" "+string(body))
				mu.Unlock()
				http.Redirect(w, r, "/payments/1001", http.StatusSeeOther)
			})))
			defer srv.Close()
			c := srv.Client()
			c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
			send := func(method, path, body, recorded string) (*http.Response, string) {
				t.Helper()
				req := newRequest(t, method, srv.URL+path, body)
				req.Header.Set(guard.TokenHeader, "5")
				req.Header.Set(guard.CallHeader, "approve-1001")
				if recorded != "" {
					req.Header.Set(guard.RecordedCallHeader, recorded)
				}
				return do(t, c, req)
			}
			resp, _ := send(http.MethodPost, "/payments/1001/approve", "approve", "")
			recorded := resp.Header.Get(guard.RecordedCallHeader)
			if resp.StatusCode != http.StatusSeeOther || recorded == "" {
				t.Fatalf("POST: %d, %s %q; want 303 with the recorded call", resp.StatusCode, guard.RecordedCallHeader, recorded)
			}
			for _, w := range []struct{ method, path, body string }{
				{http.MethodPost, "/payments/1001/approve", "refund"},
				{http.MethodDelete, "/payments/1001", ""},
				{http.MethodPut, "/payments/1001/approve", "approve"},
			} {
				bare, bareBody := send(w.method, w.path, w.body, "")
				resp, body := send(w.method, w.path, w.body, recorded)
				if resp.StatusCode != bare.StatusCode || resp.Header.Get(guard.ReplayedHeader) != bare.Header.Get(guard.ReplayedHeader) {
					t.Errorf("%s %s %q with the applied call's %s: %d %s %q, %s; want it answered as without: %d %q, %s", w.method, w.path, w.body,
						guard.RecordedCallHeader, resp.StatusCode, guard.ReplayedHeader, resp.Header.Get(guard.ReplayedHeader), body,
						bare.StatusCode, bare.Header.Get(guard.ReplayedHeader), bareBody)
				}
			}
			// The follow-up http.Client makes after the 303 is still the
			// applied call.
			resp, body := send(http.MethodGet, "/payments/1001", "", recorded)
			if resp.Header.Get(guard.ReplayedHeader) == "" {
				t.Errorf("GET with the applied call's %s: %d %s; want it answered as the applied call", guard.RecordedCallHeader, resp.StatusCode, body)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(ran) != 1 {
				t.Errorf("the handler ran for %q; want only the first POST", ran)
			}
		})
	}
}

// TestRecordedCallOnlyOnRedirects: Middleware set Fence-Recorded-Call on
// every committed answer, though Transport reads it only from a redirect's:
// on a 200, two allocations per request (29 to 31 for a POST over
// MemoryStore, measured with testing.AllocsPerRun against the commit before
// the header) and the bytes on the wire, for nothing. It is set on a
// committed redirect only now.
func TestRecordedCallOnlyOnRedirects(t *testing.T) {
	h := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{Resource: oneResource})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, "/payments/1001", http.StatusSeeOther)
		}
	}))
	for i, tc := range []struct {
		path string
		want bool
	}{{"/ok", false}, {"/redirect", true}} {
		req := httptest.NewRequest(http.MethodPost, tc.path, nil)
		req.Header.Set(guard.TokenHeader, strconv.Itoa(i+1))
		req.Header.Set(guard.CallHeader, "approve-1001")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if got := w.Header().Get(guard.RecordedCallHeader) != ""; got != tc.want || w.Code >= 400 {
			t.Errorf("%s: %d, %s %q; want it set: %v", tc.path, w.Code, guard.RecordedCallHeader, w.Header().Get(guard.RecordedCallHeader), tc.want)
		}
	}
}

// TestRecordedCallNonCanonicalNotForwarded: the caller puts an applied
// call's recorded id in its request under a key that is not canonical
// ("fence-recorded-call", set on the map directly, as a header copied from
// a lowercased source is). net/http sends it as it is, and the server
// reads it as Fence-Recorded-Call; Transport deleted only the canonical key,
// and the GET, a new call under a spent token, was told it was the applied
// call (before: 200 Fence-Replayed: true, the page not run). Transport now
// drops the header under any spelling, and the GET is 409 stale.
func TestRecordedCallNonCanonicalNotForwarded(t *testing.T) {
	s := seeOtherStores(t)["memory"]
	site := newRedirectSite(t, guard.Middleware(s.store, guard.HTTPOptions{Resource: siteResource, Namespace: "httprecnc:"}),
		func(r *http.Request) error { return s.write(r, 5) })
	c := site.client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, _ := do(t, c, newRequest(t, http.MethodPost, site.srv.URL+hop("/payments/1001/approve", "/payments/1001", http.StatusSeeOther), "approve"))
	recorded := resp.Header.Get(guard.RecordedCallHeader)
	if resp.StatusCode != http.StatusSeeOther || recorded == "" {
		t.Fatalf("POST: %d, %s %q; want the 303 with the call id it was recorded under", resp.StatusCode, guard.RecordedCallHeader, recorded)
	}
	req := newRequest(t, http.MethodGet, site.srv.URL+"/payments/1001", "")
	req.Header["fence-recorded-call"] = []string{recorded}
	resp, body := do(t, c, req)
	if resp.StatusCode != http.StatusConflict || site.ran("/payments/1001") != 0 {
		t.Errorf("a GET carrying the first call's recorded id under a lowercase key: %d %s %q, %s, the page ran %d times; want 409 stale, as a new call",
			resp.StatusCode, guard.ReplayedHeader, resp.Header.Get(guard.ReplayedHeader), body, site.ran("/payments/1001"))
	}
}
