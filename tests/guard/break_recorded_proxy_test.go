package guard_test

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fence/guard"
)

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
	for _, name := range []string{"proxy", "in-process"} {
		t.Run(name, func(t *testing.T) {
			var writes, pages atomic.Int32
			inner := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{Resource: siteResource})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/payments/1001/approve" {
					writes.Add(1)
					http.Redirect(w, r, "/payments/1001", http.StatusSeeOther)
					return
				}
				pages.Add(1)
			}))
			if name == "proxy" {
				upstream := httptest.NewServer(inner)
				defer upstream.Close()
				target, err := url.Parse(upstream.URL)
				if err != nil {
					t.Fatal(err)
				}
				inner = httputil.NewSingleHostReverseProxy(target)
			}
			front := httptest.NewServer(guard.Gate(redisStore(t), guard.HTTPOptions{Resource: siteResource})(inner))
			defer front.Close()
			c := &http.Client{Transport: &guard.Transport{Base: front.Client().Transport, Lease: leases(t)()}}
			resp, body := do(t, c, newRequest(t, http.MethodPost, front.URL+"/payments/1001/approve", "approve"))
			if resp.StatusCode != http.StatusConflict || resp.Header.Get(guard.ReplayedHeader) != "admitted" || !strings.Contains(body, guard.ProblemAdmitted) ||
				writes.Load() != 1 || pages.Load() != 0 {
				t.Errorf("answer %d, %s %q, %s, %d writes, page ran %d times; want the applied call (Gate: 409 admitted), 1, 0",
					resp.StatusCode, guard.ReplayedHeader, resp.Header.Get(guard.ReplayedHeader), strings.TrimSpace(body), writes.Load(), pages.Load())
			}
		})
	}
}
