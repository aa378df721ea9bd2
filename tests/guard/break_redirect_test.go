package guard_test

import (
	"errors"
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

// memLease returns a memlock lease on name, released when the test ends.
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

// TestTransportDoesNotFollowToOtherOrigin: the fenced server answers 307
// with a Location on another origin (an open redirect, a misconfigured
// proxy, a compromised server). http.Client follows it, resending the body;
// guard.Transport set the lease's token and resource on every request it
// was given, so the other origin received a live fencing token and the
// holder's write: an unfenced server would apply it unchecked, and any
// server could send the token on to the resource ahead of the holder.
// Transport now refuses to send a redirected request to an origin (scheme,
// host and port) other than the first request's, with ErrCrossOrigin; the
// other server sees nothing.
func TestTransportDoesNotFollowToOtherOrigin(t *testing.T) {
	var other atomic.Int32
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		other.Add(1)
		t.Logf("other origin got %s %s, %s %q", r.Method, r.URL, guard.TokenHeader, r.Header.Get(guard.TokenHeader))
	}))
	defer elsewhere.Close()
	var here atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		here.Add(1)
		switch r.URL.Path {
		case "/away":
			http.Redirect(w, r, elsewhere.URL+"/steal", http.StatusTemporaryRedirect)
		case "/local":
			http.Redirect(w, r, "/done", http.StatusTemporaryRedirect)
		default:
			if r.Header.Get(guard.TokenHeader) == "" {
				http.Error(w, "no token", http.StatusBadRequest)
			}
		}
	}))
	defer srv.Close()
	c := &http.Client{Transport: &guard.Transport{Base: http.DefaultTransport, Lease: memLease(t, "lock:payment:1001")}}
	defer c.CloseIdleConnections()

	resp, err := c.Post(srv.URL+"/away", "text/plain", strings.NewReader("approve"))
	if err == nil {
		resp.Body.Close()
	}
	if !errors.Is(err, guard.ErrCrossOrigin) || other.Load() != 0 {
		t.Errorf("POST redirected to another origin: %v, the other origin hit %d times; want ErrCrossOrigin and nothing sent there", err, other.Load())
	}
	// A redirect on the same origin is followed, with the token.
	resp, err = c.Post(srv.URL+"/local", "text/plain", strings.NewReader("approve"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || here.Load() != 3 {
		t.Errorf("POST redirected on its own origin: answer %d, %d requests to the server; want 200 and 3", resp.StatusCode, here.Load())
	}
}
