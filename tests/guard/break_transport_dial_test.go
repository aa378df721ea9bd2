package guard_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/memlock"
)

// TestTransportLeaseEndsWhileConnecting: guard.Transport checks the lease
// when RoundTrip is called; the request then waits for a connection (a
// slow dial, a full pool) while the lease ends, and was sent anyway,
// carrying the token of a lease that had ended, against Transport's doc
// ("refuses to send once the lease has ended").
func TestTransportLeaseEndsWhileConnecting(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer srv.Close()
	dialing, proceed := make(chan struct{}), make(chan struct{})
	base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		close(dialing)
		select {
		case <-proceed:
		case <-time.After(10 * time.Second):
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	defer base.CloseIdleConnections()
	l, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx(t), "lock:payment:1001", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &guard.Transport{Base: base, Lease: lease}}
	done := postAsync(c, srv.URL)
	<-dialing
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	err = <-done
	if hits.Load() != 0 || !errors.Is(err, fence.ErrReleased) {
		t.Errorf("lease released while the request waited for its connection: server hit %d times, Do = %v; want nothing sent and an error matching fence.ErrReleased", hits.Load(), err)
	}
	t.Logf("Do: %v", err)

	// A request already sent is not cancelled when the lease ends: its
	// answer, body and all, still reaches the caller.
	arrived, answer := make(chan struct{}), make(chan struct{})
	srv2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-answer
		_, _ = w.Write([]byte("approved"))
	}))
	defer srv2.Close()
	lease2, err := l.Acquire(ctx(t), "lock:payment:1002", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c2 := &http.Client{Transport: &guard.Transport{Base: srv2.Client().Transport, Lease: lease2}}
	type result struct {
		body string
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := c2.Post(srv2.URL, "text/plain", strings.NewReader("approve"))
		if err != nil {
			got <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		got <- result{string(b), err}
	}()
	<-arrived
	if err := lease2.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	close(answer)
	if r := <-got; r.err != nil || r.body != "approved" {
		t.Errorf("lease released after the request was sent: body %q, %v; want the answer", r.body, r.err)
	}
}

// TestTransportHTTP2: guard.Transport over HTTP/2, to a Middleware: the
// token and resource arrive, the answer's body is read whole, a stale
// token is refused, and the lease's end cancels nothing already answered
// (held).
func TestTransportHTTP2(t *testing.T) {
	mw := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{Resource: guard.ResourceFromHeader})
	srv, client := h2Server(t, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write([]byte(r.Proto + " " + r.Header.Get(guard.ResourceHeader) + " " + string(b)))
	})))
	lease := memLease(t, "lock:payment:1001")
	c := &http.Client{Transport: &guard.Transport{Base: client.Transport, Lease: lease, Resource: "payment:1001"}}
	for i, want := range []int{http.StatusOK, http.StatusConflict} {
		resp, err := c.Post(srv.URL, "text/plain", strings.NewReader("approve"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != want || (i == 0 && string(b) != "HTTP/2.0 payment:1001 approve") {
			t.Errorf("request %d over HTTP/2: %d %q, %v; want %d", i, resp.StatusCode, b, err, want)
		}
	}
}

// laggingLease is a lease whose Context has not ended yet when Err already
// says the lease has: the moment between a lease's end and the goroutine
// that context.AfterFunc starts for it, which a loaded machine stretches
// (a CI run: the dial completed first, and the request went out).
type laggingLease struct{ fence.Lease }

func (laggingLease) Context() context.Context { return context.Background() }

// unannouncedLease is a lease whose Context's Err says it has ended when
// its Err does, but whose Done channel never closes: the moment after a
// lease's Context was cancelled and before the goroutine that
// context.AfterFunc starts for it has run, held for as long as the test
// needs. Transport must look at the Context itself (leaseCheck) for an
// HTTP/2 stream, where it does not call the lease's Err (which may tell
// the lease's Observer, with net/http's connection locks held).
type unannouncedLease struct{ fence.Lease }

func (l unannouncedLease) Context() context.Context { return unannounced{l.Lease} }

type unannounced struct{ lease fence.Lease }

func (unannounced) Deadline() (time.Time, bool) { return time.Time{}, false }
func (unannounced) Done() <-chan struct{}       { return nil }
func (unannounced) Value(any) any               { return nil }
func (u unannounced) Err() error {
	if u.lease.Err() != nil {
		return context.Canceled
	}
	return nil
}

// TestTransportLeaseEndsAsItGetsItsConnection: the lease ends while the
// request asks for its connection (here: in the caller's GetConn hook),
// or just after it got it (the caller's GotConn hook, which runs after
// Transport's), and the cancel that the lease's context starts has not run
// by the time the request is written, on a connection fresh or kept alive.
// Transport then checks the lease itself, and nothing reaches the server:
// net/http writes an HTTP/1 request on the connection it got whatever the
// request's context says. (The GotConn case sent the request on HTTP/1 and
// HTTP/2 alike before Transport looked at the lease at the first header.)
func TestTransportLeaseEndsAsItGetsItsConnection(t *testing.T) {
	for _, hook := range []string{"GetConn", "GotConn"} {
		t.Run(hook, func(t *testing.T) { testLeaseEndsAtConnection(t, hook) })
	}
}

func testLeaseEndsAtConnection(t *testing.T, hook string) {
	var hits atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(guard.TokenHeader) != "" {
			hits.Add(1)
		}
	})
	h1 := httptest.NewServer(handler)
	defer h1.Close()
	h2, h2Client := h2Server(t, handler)
	for _, c := range []struct {
		name string
		srv  *httptest.Server
		base http.RoundTripper
	}{{"HTTP/1.1", h1, h1.Client().Transport}, {"HTTP/2", h2, h2Client.Transport}} {
		t.Run(c.name, func(t *testing.T) {
			l, err := memlock.New(nil)
			if err != nil {
				t.Fatal(err)
			}
			hits.Store(0)
			for i := range 20 {
				if i%2 == 1 { // every other try on a fresh connection
					c.base.(interface{ CloseIdleConnections() }).CloseIdleConnections()
				}
				lease, err := l.Acquire(ctx(t), "lock:payment:1001", fence.TTL(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				// A request without the lease, to keep a connection alive.
				warm, err := c.base.RoundTrip(httptest.NewRequestWithContext(ctx(t), http.MethodGet, c.srv.URL, nil).WithContext(ctx(t)))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, warm.Body)
				warm.Body.Close()
				if i%2 == 1 {
					c.base.(interface{ CloseIdleConnections() }).CloseIdleConnections()
				}
				var releaseErr error
				trace := &httptrace.ClientTrace{GetConn: func(string) { releaseErr = lease.Release(ctx(t)) }}
				if hook == "GotConn" {
					trace = &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { releaseErr = lease.Release(ctx(t)) }}
				}
				rctx := httptrace.WithClientTrace(ctx(t), trace)
				req, err := http.NewRequestWithContext(rctx, http.MethodPost, c.srv.URL, strings.NewReader("approve"))
				if err != nil {
					t.Fatal(err)
				}
				var sent fence.Lease = laggingLease{lease}
				if hook == "GotConn" {
					// After Transport's GotConn: only its own looks at the
					// lease's Context (HTTP/2) and at its Err (HTTP/1's
					// first header) can stop the request.
					sent = unannouncedLease{lease}
				}
				resp, err := (&http.Client{Transport: &guard.Transport{Base: c.base, Lease: sent}}).Do(req)
				if err == nil {
					resp.Body.Close()
				}
				if releaseErr != nil {
					t.Fatal(releaseErr)
				}
				if n := hits.Load(); n != 0 || !errors.Is(err, fence.ErrReleased) {
					t.Fatalf("try %d: lease released as the request got its connection: server hit %d times, Do = %v; want nothing sent and an error matching fence.ErrReleased", i, n, err)
				}
			}
		})
	}
}

// postAsync posts "approve" to url through c in the background; Do's error
// comes on the channel once the answer's body is closed.
func postAsync(c *http.Client, url string) <-chan error {
	done := make(chan error, 1)
	go func() {
		resp, err := c.Post(url, "text/plain", strings.NewReader("approve"))
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	return done
}

// getAsync sends a GET of url through rt in the background, reads its
// answer whole, and sends RoundTrip's error on the channel.
func getAsync(t *testing.T, rt http.RoundTripper, url string) <-chan error {
	held := make(chan error, 1)
	go func() {
		resp, err := rt.RoundTrip(httptest.NewRequestWithContext(ctx(t), http.MethodGet, url, nil))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		held <- err
	}()
	return held
}
