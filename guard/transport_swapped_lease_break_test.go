package guard_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/memlock"
)

// swapped sends each request through the next of its Transports (the
// last one again once they run out): a client that hands requests to the
// Transport of the lease it holds now, which changed between a call and
// the follow-up of its redirect.
type swapped struct {
	trs  []*guard.Transport
	sent int
}

func (s *swapped) RoundTrip(req *http.Request) (*http.Response, error) {
	tr := s.trs[min(s.sent, len(s.trs)-1)]
	s.sent++
	return tr.RoundTrip(req)
}

// TestFollowUpUnderAnotherLeaseRefused: a POST sent with token 1 was
// applied and answered 303; the follow-up went out with token 2 (the
// client's lease changed between the hops) and with the POST's call id and
// recorded ids. The page, fenced on the same resource, found token 2 new,
// ran as a call of its own (200, the page) and spent it: the new lease's
// own write was then 409 stale ("POST with token 2 after the follow-up:
// 409"). The follow-up is part of a call made under another lease:
// Transport refuses it (ErrOtherLease), sending nothing, and the new
// lease's token is left for its own work.
func TestFollowUpUnderAnotherLeaseRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /approve", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/page", http.StatusSeeOther)
	})
	mux.HandleFunc("GET /page", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "page") })
	mux.HandleFunc("POST /next", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "next") })
	opts := guard.HTTPOptions{Resource: func(*http.Request) (string, error) { return "payment:1001", nil }, MaxAhead: -1}
	srv := httptest.NewServer(guard.Middleware(&guard.MemoryStore{}, opts)(mux))
	defer srv.Close()
	l, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	var trs []*guard.Transport
	for _, name := range []string{"lock:old", "lock:new"} {
		lease, err := l.Acquire(ctx, name, fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(context.Background())
		trs = append(trs, &guard.Transport{Lease: lease, Resource: "payment:1001"})
	}
	if trs[0].Lease.Token() >= trs[1].Lease.Token() {
		t.Fatalf("tokens %d then %d, want increasing", trs[0].Lease.Token(), trs[1].Lease.Token())
	}
	c := &http.Client{Transport: &swapped{trs: trs}}
	send := func(method, path string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, body := send(http.MethodPost, "/approve")
	t.Logf("POST with token %d, followed with token %d: %d %q", trs[0].Lease.Token(), trs[1].Lease.Token(), code, body)
	if code != 0 || !strings.Contains(body, guard.ErrOtherLease.Error()) {
		t.Errorf("the follow-up under another lease: %d %q, want Do's error with %q", code, body, guard.ErrOtherLease)
	}
	if code, body := send(http.MethodPost, "/next"); code != http.StatusOK {
		t.Errorf("POST with token %d after the follow-up: %d %s; want 200: the new lease's token was spent by the old call's follow-up", trs[1].Lease.Token(), code, body)
	}
}
