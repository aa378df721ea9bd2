package guard_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/fencekit/fence/guard"
)

// The follow-up of a redirect on the wire: net/http's own resend of it, and
// HTTP/2. (Held: attacks that did not bite.)

// followUpServer serves the fenced POST /payments/1001/approve (it applies
// and answers 303 to /payments/1001) and the page /payments/1001 behind mw,
// and records the call ids each request arrived with. The first request for
// the page, when hijack is set, has its connection closed unanswered.
type followUpServer struct {
	mu     sync.Mutex
	seen   []string // path, Fence-Call, Fence-Recorded-Call of each request
	hijack bool
	ran    int // runs of the handler behind mw
}

func (s *followUpServer) handler(mw func(http.Handler) http.Handler) http.Handler {
	fenced := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.ran++
		s.mu.Unlock()
		if r.URL.Path == "/payments/1001/approve" {
			http.Redirect(w, r, "/payments/1001", http.StatusSeeOther)
		}
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.seen = append(s.seen, r.URL.Path+" "+r.Header.Get(guard.CallHeader)+" "+r.Header.Get(guard.RecordedCallHeader))
		drop := s.hijack && r.URL.Path == "/payments/1001"
		s.hijack = s.hijack && !drop
		s.mu.Unlock()
		if drop {
			// The connection breaks before the answer: net/http sends the
			// GET again by itself, on a new connection.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		fenced.ServeHTTP(w, r)
	})
}

// check fails t unless the POST ran once, the page never, every follow-up
// carried the POST's call id and the id it was recorded under, and the
// caller was told its call was applied.
func (s *followUpServer) check(t *testing.T, resp *http.Response, body string, follow int) {
	t.Helper()
	wantReplayed(t, resp, body)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ran != 1 || len(s.seen) != 1+follow {
		t.Fatalf("handler ran %d times, requests seen %q; want 1 run, %d requests", s.ran, s.seen, 1+follow)
	}
	for _, f := range s.seen[1:] {
		if f != s.seen[1] || len(f) < len("/payments/1001 x req-") {
			t.Errorf("requests seen %q; want every follow-up with the POST's call id and its recorded id", s.seen)
		}
	}
}

// TestFollowUpResentByNetHTTP: the GET that follows the 303 goes out on the
// POST's kept-alive connection, which closes before the answer; net/http
// sends it again on a new connection, the same call and recorded ids on
// both copies: the resend is answered as the applied call, the page not run.
func TestFollowUpResentByNetHTTP(t *testing.T) {
	s := &followUpServer{hijack: true}
	srv := httptest.NewServer(s.handler(guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{Resource: oneResource})))
	defer srv.Close()
	c := &http.Client{Transport: &guard.Transport{Base: srv.Client().Transport, Lease: leases(t)()}}
	resp, body := do(t, c, newRequest(t, http.MethodPost, srv.URL+"/payments/1001/approve", "approve"))
	s.check(t, resp, body, 2)
}

// TestFollowUpOverHTTP2: the POST and its follow-up over HTTP/2 (TLS):
// the follow-up is the applied call, as over HTTP/1.1.
func TestFollowUpOverHTTP2(t *testing.T) {
	s := &followUpServer{}
	srv := httptest.NewUnstartedServer(s.handler(guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{Resource: oneResource})))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	c := &http.Client{Transport: &guard.Transport{Base: srv.Client().Transport, Lease: leases(t)()}}
	resp, body := do(t, c, newRequest(t, http.MethodPost, srv.URL+"/payments/1001/approve", "approve"))
	if resp.ProtoMajor != 2 {
		t.Fatalf("answer over %s; want HTTP/2", resp.Proto)
	}
	s.check(t, resp, body, 1)
}
