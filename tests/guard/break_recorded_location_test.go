package guard_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fence/guard"
)

// TestSeeOtherLocationSpellings: the fenced POST answers 303 with a
// Location written as it is (not through http.Redirect, which cleans it):
// with a fragment, relative, with dot segments, percent-encoded, with an
// empty query, scheme-relative, absolute. Transport takes a request for the
// follow-up only if its URL is the Location resolved against the request
// it follows, and http.Client resolves it the same way, so every one is
// the applied call (its page, on the same resource, not run). (Held: attack
// that did not bite; with isFollowUp always false, each is 409 stale.)
func TestSeeOtherLocationSpellings(t *testing.T) {
	var pages atomic.Int32
	srv := httptest.NewServer(guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{Resource: oneResource})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			w.Header().Set("Location", r.URL.Query().Get("to"))
			w.WriteHeader(http.StatusSeeOther)
			return
		}
		pages.Add(1)
	})))
	defer srv.Close()
	next := leases(t)
	hostPort := strings.TrimPrefix(srv.URL, "http://")
	for _, loc := range []string{
		"/payments/1001#receipt",
		"1001?b=2&a=1",
		"../1001/./x/../",
		"/payments/%31001?x=%2F&y=a+b",
		"/payments/1001?",
		"//" + hostPort + "/payments/1001",
		"HTTP://" + strings.ToUpper(hostPort) + "/payments/1001",
	} {
		c := &http.Client{Transport: &guard.Transport{Base: srv.Client().Transport, Lease: next()}}
		resp, body := do(t, c, newRequest(t, http.MethodPost, srv.URL+"/payments/1001/approve?to="+url.QueryEscape(loc), "approve"))
		if resp.Header.Get(guard.ReplayedHeader) != "true" {
			t.Errorf("Location %q: %d %s; want the applied call", loc, resp.StatusCode, body)
		}
	}
	if pages.Load() != 0 {
		t.Errorf("the page ran %d times; want 0", pages.Load())
	}
}
