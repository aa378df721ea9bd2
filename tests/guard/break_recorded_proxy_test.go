package guard_test

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fence/guard"
)

// Gate in front of Middleware, as Gate's doc asks: the write is fenced
// again where it lands. Each layer's store records the call under its own
// id, and the answer's Fence-Recorded-Call lists both.

// twoLayers is Gate over redisstore in front of Middleware over store
// (a MemoryStore if nil), through httputil.ReverseProxy ("proxy") or in
// one process ("in-process"), both fencing by siteResource. Behind them a
// POST to .../approve writes and answers 303 to the page it is under; any
// other request is a page.
type twoLayers struct {
	srv           *httptest.Server
	writes, pages atomic.Int32
}

func newTwoLayers(t *testing.T, how string, store guard.Store) *twoLayers {
	t.Helper()
	if store == nil {
		store = &guard.MemoryStore{}
	}
	l := &twoLayers{}
	inner := guard.Middleware(store, guard.HTTPOptions{Resource: siteResource})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if page, ok := strings.CutSuffix(r.URL.Path, "/approve"); ok && r.Method == http.MethodPost {
			l.writes.Add(1)
			http.Redirect(w, r, page, http.StatusSeeOther)
			return
		}
		l.pages.Add(1)
	}))
	if how == "proxy" {
		upstream := httptest.NewServer(inner)
		t.Cleanup(upstream.Close)
		target, err := url.Parse(upstream.URL)
		if err != nil {
			t.Fatal(err)
		}
		inner = httputil.NewSingleHostReverseProxy(target)
	}
	l.srv = httptest.NewServer(guard.Gate(redisStore(t), guard.HTTPOptions{Resource: siteResource})(inner))
	t.Cleanup(l.srv.Close)
	return l
}

// send sends method path with token and call id (Fence-Call) and the
// given Fence-Recorded-Call lines, by hand, not through Transport (which
// sends only the ids a redirect's answer carries), and follows no
// redirect.
func (l *twoLayers) send(t *testing.T, method, path string, token int, call string, recorded ...string) (*http.Response, string) {
	t.Helper()
	body := ""
	if method == http.MethodPost {
		body = "approve"
	}
	req := newRequest(t, method, l.srv.URL+path, body)
	req.Header.Set(guard.TokenHeader, strconv.Itoa(token))
	req.Header.Set(guard.CallHeader, call)
	req.Header[guard.RecordedCallHeader] = recorded
	c := l.srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return do(t, c, req)
}

// approve POSTs path's approve with token and call and returns the ids the
// 303 lists, failing t unless there are two, Gate's then Middleware's.
func (l *twoLayers) approve(t *testing.T, path string, token int, call string) []string {
	t.Helper()
	resp, body := l.send(t, http.MethodPost, path+"/approve", token, call)
	ids := resp.Header.Values(guard.RecordedCallHeader)
	if resp.StatusCode != http.StatusSeeOther || len(ids) != 2 {
		t.Fatalf("POST %s/approve with token %d: %d %s, %s %q; want 303 with two ids, Gate's and Middleware's", path, token, resp.StatusCode, body, guard.RecordedCallHeader, ids)
	}
	return ids
}

// TestSeeOtherThroughGateInFrontOfMiddleware: Gate over redisstore admits
// the fenced POST, and the write is fenced again where it lands, behind
// Middleware, as Gate's doc asks: through httputil.ReverseProxy to another
// service, or Middleware inside Gate in one process. The write is applied
// and answered 303 to the payment's page, behind the same two, and
// http.Client follows it through Transport. The two layers hand their
// stores different ids (Gate's digest leaves the body out), and the
// header carried one: through the proxy the 303 carried both (Gate's, set
// before its handler, and the upstream's, added by the proxy), Transport
// took neither, and Gate answered the follow-up 409 stale; in one process
// Middleware's id replaced Gate's on the answer, and Gate answered the
// follow-up carrying it 409 stale. Either way Do returned 409 stale
// ("This fencing token was already used for another call on this
// resource", last_accepted_token the POST's own) for a write that was
// applied. The header is a list now, each layer adds its id and tries
// them all: the follow-up is Gate's 409 admitted, the page not run.
func TestSeeOtherThroughGateInFrontOfMiddleware(t *testing.T) {
	for _, how := range []string{"proxy", "in-process"} {
		t.Run(how, func(t *testing.T) {
			l := newTwoLayers(t, how, nil)
			c := &http.Client{Transport: &guard.Transport{Base: l.srv.Client().Transport, Lease: leases(t)()}}
			resp, body := do(t, c, newRequest(t, http.MethodPost, l.srv.URL+"/payments/1001/approve", "approve"))
			if resp.StatusCode != http.StatusConflict || resp.Header.Get(guard.ReplayedHeader) != "admitted" || !strings.Contains(body, guard.ProblemAdmitted) ||
				l.writes.Load() != 1 || l.pages.Load() != 0 {
				t.Errorf("answer %d, %s %q, %s, %d writes, page ran %d times; want the applied call (Gate: 409 admitted), 1, 0",
					resp.StatusCode, guard.ReplayedHeader, resp.Header.Get(guard.ReplayedHeader), strings.TrimSpace(body), l.writes.Load(), l.pages.Load())
			}
		})
	}
}

// TestRecordedListAttacksThroughGateAndMiddleware: requests sent by hand
// to the two layers after tokens 5 and then 7 applied a POST to
// /payments/1001/approve, and 7 one to /receipts/1001/approve. Only a GET
// with the last token, carrying a list that holds one of the ids its own
// call on this resource was recorded under, is answered as that call
// (Gate's 409 admitted); the page never runs. 409 stale: a GET without
// the header, or with the ids of a lower token's call, of another token's
// call, of the same token's call on another resource, or forged ids
// around them; a DELETE with the token's own ids (a write is handed over
// under its digest). 400: more than 4 ids, a malformed or an empty member.
// Before the list, the 400s were the same, and every list of two ids or
// more was 400 too (two headers): the stale cases were refused all the
// same, but the token's own ids after a forged one, the case that failed,
// were 400 instead of the call; Gate now asks its store with the forged
// id (stale, the token spent by another call) and then with its own.
func TestRecordedListAttacksThroughGateAndMiddleware(t *testing.T) {
	for _, how := range []string{"proxy", "in-process"} {
		t.Run(how, func(t *testing.T) {
			l := newTwoLayers(t, how, nil)
			ids5 := l.approve(t, "/payments/1001", 5, "approve-5")
			ids7 := l.approve(t, "/payments/1001", 7, "approve-7")
			receipt7 := l.approve(t, "/receipts/1001", 7, "approve-7")
			for _, tc := range []struct {
				name     string
				method   string // "" is GET
				token    int
				recorded []string
				status   int
				problem  string
				last     string // the last accepted token the 409 stale names
			}{
				{"no header", "", 7, nil, http.StatusConflict, guard.ProblemStale, "7"},
				{"lower token with its own call's ids", "", 5, ids5, http.StatusConflict, guard.ProblemStale, "7"},
				{"the other call's ids", "", 7, ids5, http.StatusConflict, guard.ProblemStale, "7"},
				{"the ids of its call on another resource", "", 7, receipt7, http.StatusConflict, guard.ProblemStale, "7"},
				{"forged ids around another call's", "", 7, []string{"req-forged", ids5[0], "req-x," + ids5[1]}, http.StatusConflict, guard.ProblemStale, "7"},
				{"5 ids", "", 7, []string{ids7[0], ids7[1], "a", "b", "c"}, http.StatusBadRequest, guard.ProblemCall, ""},
				{"5 ids on one line", "", 7, []string{strings.Join([]string{ids7[0], ids7[1], "a", "b", "c"}, ", ")}, http.StatusBadRequest, guard.ProblemCall, ""},
				{"a malformed member", "", 7, []string{ids7[0], ids7[1] + " x"}, http.StatusBadRequest, guard.ProblemCall, ""},
				{"an empty member", "", 7, []string{ids7[0] + ",", ids7[1]}, http.StatusBadRequest, guard.ProblemCall, ""},
				{"a DELETE with its own call's ids", http.MethodDelete, 7, ids7, http.StatusConflict, guard.ProblemStale, "7"},
				{"its own call's ids after a forged one", "", 7, []string{"req-forged", ids7[1], ids7[0]}, http.StatusConflict, guard.ProblemAdmitted, ""},
			} {
				method := tc.method
				if method == "" {
					method = http.MethodGet
				}
				resp, body := l.send(t, method, "/payments/1001", tc.token, "approve-"+strconv.Itoa(tc.token), tc.recorded...)
				if resp.StatusCode != tc.status || !strings.Contains(body, tc.problem) || tc.last != "" && !strings.Contains(body, `"last_accepted_token":`+tc.last) {
					t.Errorf("%s (%s, token %d, %s %q): %d %s; want %d %s, last accepted %s", tc.name, method, tc.token, guard.RecordedCallHeader, tc.recorded,
						resp.StatusCode, body, tc.status, tc.problem, tc.last)
				}
			}
			if l.writes.Load() != 3 || l.pages.Load() != 0 {
				t.Errorf("%d writes, the page ran %d times; want 3, 0", l.writes.Load(), l.pages.Load())
			}
		})
	}
}

// TestSeeOtherThroughMiddlewareInFrontOfGate: the layers the other way
// round, in one process: Middleware (over MemoryStore, or SQLStore on
// PostgreSQL) in front of Gate over redisstore. The 303 lists Gate's id,
// which Gate added to the answer Middleware holds, then Middleware's; the
// follow-up meets Middleware first, whose store finds the token spent by
// another call under Gate's id and replays the call under its own: 200,
// Fence-Replayed: true, the page not run. Before the list the follow-up
// was answered so too, but the 303 carried one id, Middleware's, which
// had replaced Gate's (seen: [["req-cef171b9…"]]); and were Middleware to
// ask its store with the list's first id only, the follow-up would be 409
// stale (checked by mutation).
func TestSeeOtherThroughMiddlewareInFrontOfGate(t *testing.T) {
	for name, s := range seeOtherStores(t) {
		t.Run(name, func(t *testing.T) {
			opts := guard.HTTPOptions{Resource: siteResource, Namespace: "httpmwgate:"}
			var writes, pages atomic.Int32
			srv := httptest.NewServer(guard.Middleware(s.store, opts)(guard.Gate(redisStore(t), opts)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/payments/1001/approve" {
					writes.Add(1)
					http.Redirect(w, r, "/payments/1001", http.StatusSeeOther)
					return
				}
				pages.Add(1)
			}))))
			defer srv.Close()
			var lists [][]string // the Fence-Recorded-Call of each redirect followed
			c := &http.Client{
				Transport: &guard.Transport{Base: srv.Client().Transport, Lease: leases(t)()},
				CheckRedirect: func(req *http.Request, _ []*http.Request) error {
					lists = append(lists, req.Response.Header.Values(guard.RecordedCallHeader))
					return nil
				},
			}
			resp, body := do(t, c, newRequest(t, http.MethodPost, srv.URL+"/payments/1001/approve", "approve"))
			wantReplayed(t, resp, body)
			if len(lists) != 1 || len(lists[0]) != 2 || writes.Load() != 1 || pages.Load() != 0 {
				t.Errorf("redirects followed with %s %q, %d writes, page ran %d times; want one, with two ids (Gate's, Middleware's), 1, 0",
					guard.RecordedCallHeader, lists, writes.Load(), pages.Load())
			}
		})
	}
}
