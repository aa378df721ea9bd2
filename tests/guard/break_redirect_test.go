package guard_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/memlock"
)

// The redirects a fenced request may meet, followed by http.Client through
// guard.Transport.

// lease returns a memlock lease on name, released when the test ends.
func memLease(t *testing.T, name string) fence.Lease {
	t.Helper()
	l, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Release(ctx(t)) })
	return lease
}

// TestTemporaryRedirectLeavesTokenUnspent: a handler behind Middleware over
// SQLStore answers a fenced POST with 307 Temporary Redirect (or 308) to
// the resource's canonical URL on the same server, having written nothing:
// 307 and 308 tell the client to send the same request again, body and
// token included, to the new URL, and http.Client does so. Middleware
// committed every 3xx, so the token was spent on the redirect and the
// resent request, the holder's one real write, was refused as stale (409),
// and the holder took itself for superseded. 307 and 308 roll back now,
// as 4xx does; 303 still commits (TestRedirectAfterWriteCommits).
// MemoryStore spends a token when it checks it, whatever the handler
// answers (its doc), and is not tried.
func TestTemporaryRedirectLeavesTokenUnspent(t *testing.T) {
	for name, s := range stateStores(t) {
		if !s.sql {
			continue
		}
		for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
			t.Run(name+"/"+strconv.Itoa(code), func(t *testing.T) {
				var redirects atomic.Int32
				mw := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource, Namespace: "http" + strconv.Itoa(code) + ":"})
				srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path != "/payments/1001" {
						redirects.Add(1)
						http.Redirect(w, r, "/payments/1001", code)
						return
					}
					body, _ := io.ReadAll(r.Body)
					if string(body) != "approve" {
						http.Error(w, "body "+strconv.Quote(string(body)), http.StatusBadRequest)
						return
					}
					if err := s.write(r, int64(code)); err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
					}
				})))
				defer srv.Close()
				c := &http.Client{Transport: &guard.Transport{Base: srv.Client().Transport, Lease: memLease(t, "lock:payment:1001")}}
				resp, err := c.Post(srv.URL+"/payments/1001/", "text/plain", strings.NewReader("approve"))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || s.read(t) != int64(code) || redirects.Load() != 1 {
					t.Fatalf("POST redirected by %d to the same resource: answer %d %s, state %d, %d redirects; want 200 and the write made (%d): the redirect spent the token",
						code, resp.StatusCode, b, s.read(t), redirects.Load(), code)
				}
			})
		}
	}
}
