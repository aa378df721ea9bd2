package guard_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/memlock"
)

// redirector answers the first request with a 307 to location and every
// other with 200, recording the URLs it was asked for; it sends nothing.
// With noRequest its answers leave Response.Request nil, as a
// RoundTripper may (http.Client does not fill it in).
type redirector struct {
	location  string
	noRequest bool
	asked     []string
}

func (r *redirector) RoundTrip(req *http.Request) (*http.Response, error) {
	r.asked = append(r.asked, req.URL.String())
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("")), Request: req}
	if len(r.asked) == 1 {
		resp.StatusCode = http.StatusTemporaryRedirect
		resp.Header.Set("Location", r.location)
	}
	if r.noRequest {
		resp.Request = nil
	}
	return resp, nil
}

// TestTransportOriginSpellings: a redirect to the same origin spelt
// otherwise (the default port written out or left off, another case, an
// IPv6 literal) is followed, and one to another port, scheme or host is
// not. (Held: attack that did not bite.)
func TestTransportOriginSpellings(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, "lock:payment:1001", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		from, to string
		same     bool
	}{
		{"http://h.test/a", "http://h.test:80/b", true},
		{"http://h.test:80/a", "http://h.test/b", true},
		{"https://h.test/a", "https://h.test:443/b", true},
		{"http://H.Test/a", "HTTP://h.test/b", true},
		{"http://[::1]/a", "http://[::1]:80/b", true},
		{"http://[::1]:8080/a", "http://[0:0:0:0:0:0:0:1]:8080/b", false}, // not normalised: refused, the safe side
		{"http://h.test/a", "http://h.test:8080/b", false},
		{"http://h.test/a", "https://h.test/b", false},
		{"https://h.test/a", "https://h.test:80/b", false},
		{"http://h.test/a", "http://h.test.evil/b", false},
		{"http://h.test/a", "http://user@evil.test/b", false},
	} {
		base := &redirector{location: tc.to}
		c := &http.Client{Transport: &guard.Transport{Base: base, Lease: lease}}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, tc.from, strings.NewReader("approve"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		if followed := len(base.asked) == 2; followed != tc.same || tc.same != (err == nil) || !tc.same && !errors.Is(err, guard.ErrCrossOrigin) {
			t.Errorf("%s -> %s: asked %v, Do = %v; want followed %v", tc.from, tc.to, base.asked, err, tc.same)
		}
	}
}

// TestTransportOriginWithoutResponseRequest: a Base whose answers leave
// Response.Request nil (a stub, a RoundTripper of another library) answers
// a fenced POST with a 307 to another origin. Transport found the first
// request by walking req.Response.Request, which http.Client does not fill
// in: the walk stopped at the redirected request itself, its origin
// matched itself, and the POST, body and token, went to the other origin
// (before: asked [http://h.test/a http://evil.test/b], Do nil). Transport
// now sets Response.Request, where Base left it nil, to the request it
// sent.
func TestTransportOriginWithoutResponseRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, "lock:payment:1001", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	base := &redirector{location: "http://evil.test/b", noRequest: true}
	c := &http.Client{Transport: &guard.Transport{Base: base, Lease: lease}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://h.test/a", strings.NewReader("approve"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	if len(base.asked) != 1 || !errors.Is(err, guard.ErrCrossOrigin) {
		t.Errorf("307 to another origin from a Base that leaves Response.Request nil: asked %v, Do = %v; want only the first request sent, ErrCrossOrigin", base.asked, err)
	}
}
