package guard_test

// Attacks on guard.Transport's check of the lease at each connection a
// request gets (a helper's review of 444062f): HTTP/2 stream slots, Bases
// that report no connection or drop the cancel, h2c, long request lines.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/memlock"
)

// waitForGoroutineIn waits, up to 10 s, until some goroutine's stack holds
// fn: the event of a request blocking inside net/http where no trace hook
// tells of it.
func waitForGoroutineIn(t *testing.T, fn string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if bytes.Contains(buf[:n], []byte(fn)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no goroutine reached %s in 10 s", fn)
		}
		<-tick.C
	}
}

// TestTransportH2StreamWaitsForSlotAsLeaseEnds: over HTTP/2 a
// request gets its connection (GotConn, where Transport stops the lease's
// watch and checks the lease) before it gets a stream on it. With the
// server's MAX_CONCURRENT_STREAMS reached and
// HTTP2Config.StrictMaxConcurrentRequests set, it then waits, after GotConn,
// for another request to end: for as long as that one takes. The lease ends
// during that wait and nothing cancels the request (the watch was stopped):
// it is sent with the ended lease's token once the slot frees. Transport now stops the
// watch only once the headers are written. With an unannouncedLease (its
// Context ended, the cancel it starts not run), the slot frees before the cancel that the
// Context's end starts could run (ci42, 2026-12-05: the plain lease's
// request went out, the server hit once, Do nil): Transport looks at the
// lease itself when net/http last asks the request's context, before the
// headers are encoded (TestTransportLeaseEndsAsItGetsItsConnection is the
// same without the wait).
func TestTransportH2StreamWaitsForSlotAsLeaseEnds(t *testing.T) {
	for _, lagging := range []bool{false, true} {
		t.Run(fmt.Sprintf("lagging=%v", lagging), func(t *testing.T) { testH2StreamWaitsForSlot(t, lagging) })
	}
}

func testH2StreamWaitsForSlot(t *testing.T, lagging bool) {
	srv, base, guarded, letGo, held := oneStream(t)

	lease := memLease(t, "lock:payment:1001")
	var sent fence.Lease = lease
	if lagging {
		sent = unannouncedLease{lease}
	}
	c := &http.Client{Transport: &guard.Transport{Base: base, Lease: sent}}
	done := postAsync(c, srv.URL+"/payments/1001")
	waitForGoroutineIn(t, "awaitOpenSlotForStreamLocked") // has its connection, waits for a stream
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	close(letGo)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	err := <-done
	if n := guarded.Load(); n != 0 || !errors.Is(err, fence.ErrReleased) {
		t.Errorf("lease released while the request waited for a stream on its HTTP/2 connection: server hit %d times, Do = %v; want nothing sent and an error matching fence.ErrReleased", n, err)
	}
}

// oneStream starts an HTTP/2 server that serves one stream at a time
// (MAX_CONCURRENT_STREAMS 1, and the client's StrictMaxConcurrentRequests),
// warms base's connection to it (the server's SETTINGS read), and has
// another client's long request (/hold) hold that one stream until letGo
// is closed; held gets that request's error. guarded counts the requests
// that carried a token.
func oneStream(t *testing.T) (srv *httptest.Server, base *http.Transport, guarded *atomic.Int32, letGo chan struct{}, held <-chan error) {
	t.Helper()
	guarded = new(atomic.Int32)
	holding := make(chan struct{})
	letGo = make(chan struct{})
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get(guard.TokenHeader) != "":
			guarded.Add(1)
		case r.URL.Path == "/hold":
			close(holding)
			<-letGo
		}
	}))
	srv.EnableHTTP2 = true
	srv.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 1}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	base = srv.Client().Transport.(*http.Transport)
	base.HTTP2 = &http.HTTP2Config{StrictMaxConcurrentRequests: true}
	t.Cleanup(base.CloseIdleConnections)
	resp, err := base.RoundTrip(httptest.NewRequestWithContext(ctx(t), http.MethodGet, srv.URL+"/warm", nil))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("warm request over %s; want HTTP/2", resp.Proto)
	}
	held = getAsync(t, base, srv.URL+"/hold")
	<-holding
	return srv, base, guarded, letGo, held
}

// clientConnServers returns an HTTP/1 and an HTTP/2 server for handler,
// each with a Go 1.26 *http.ClientConn to it: a RoundTripper on one
// connection, which calls no GotConn hook.
func clientConnServers(t *testing.T, handler http.Handler) map[string]*http.ClientConn {
	t.Helper()
	h1 := httptest.NewServer(handler)
	t.Cleanup(h1.Close)
	h2 := httptest.NewUnstartedServer(handler)
	h2.EnableHTTP2 = true
	h2.StartTLS()
	t.Cleanup(h2.Close)
	out := map[string]*http.ClientConn{}
	for name, s := range map[string]*httptest.Server{"HTTP/1.1": h1, "HTTP/2": h2} {
		scheme := "http"
		if s.TLS != nil {
			scheme = "https"
		}
		cc, err := s.Client().Transport.(*http.Transport).NewClientConn(ctx(t), scheme, s.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		out[name] = cc
	}
	return out
}

// TestTransportClientConnInFlightNotCancelled: with a Base that never
// calls GotConn (Go 1.26's *http.ClientConn; any RoundTripper that does not
// report connections through httptrace), the lease's watch is never
// stopped, so the lease's end cancels a request already at the server and
// its answer is lost, while the server applied it. Transport's doc: "a
// request already being sent is not cancelled" (as with *http.Transport,
// TestTransportLeaseEndsWhileConnecting). Failed on 444062f and before.
func TestTransportClientConnInFlightNotCancelled(t *testing.T) {
	arrived, answer := make(chan struct{}, 1), make(chan struct{}, 1)
	ccs := clientConnServers(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		<-answer
		_, _ = w.Write([]byte("approved"))
	}))
	for _, name := range []string{"HTTP/1.1", "HTTP/2"} {
		t.Run(name, func(t *testing.T) {
			lease := memLease(t, "lock:payment:1001")
			c := &http.Client{Transport: &guard.Transport{Base: ccs[name], Lease: lease}}
			type result struct {
				body string
				err  error
			}
			got := make(chan result, 1)
			go func() {
				resp, err := c.Post("http://payments.test/payments/1001", "text/plain", strings.NewReader("approve"))
				if err != nil {
					got <- result{err: err}
					return
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				got <- result{string(b), err}
			}()
			<-arrived
			if err := lease.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
			answer <- struct{}{}
			r := <-got
			if r.err != nil || r.body != "approved" {
				t.Errorf("lease released after the request reached the server: body %q, %v; want the answer", r.body, r.err)
			}
		})
	}
}

// TestTransportClientConnWaitLeaseEnds: an HTTP/1 *http.ClientConn
// takes one request at a time, and RoundTrip waits for it to be free. The
// lease ends during that wait; the request is stopped only by the cancel
// that the lease's context starts in its own goroutine (no GotConn check):
// here it lags (laggingLease, as in TestTransportLeaseEndsAsItGetsItsConnection)
// and the request goes out with the ended lease's token.
func TestTransportClientConnWaitLeaseEnds(t *testing.T) {
	t.Skip("limit, documented (Transport's doc): a Base that reports no GotConn (an *http.ClientConn) has " +
		"the lease's end caught only by the cancel that the lease's context starts in its own goroutine, " +
		"and cancelling races net/http's HTTP/1 write; there is no connection for Transport to close")
	var guarded atomic.Int32
	holding, letGo := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(guard.TokenHeader) != "" {
			guarded.Add(1)
			return
		}
		close(holding)
		<-letGo
	}))
	defer srv.Close()
	cc, err := (&http.Transport{}).NewClientConn(ctx(t), "http", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	held := getAsync(t, cc, srv.URL+"/hold")
	<-holding
	lease := memLease(t, "lock:payment:1001")
	c := &http.Client{Transport: &guard.Transport{Base: cc, Lease: laggingLease{lease}}}
	done := postAsync(c, srv.URL+"/payments/1001")
	waitForGoroutineIn(t, "waitForAvailability")
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	close(letGo)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	err = <-done
	if n := guarded.Load(); n != 0 || !errors.Is(err, fence.ErrReleased) {
		t.Errorf("lease released while the request waited for its ClientConn: server hit %d times, Do = %v; want nothing sent and an error matching fence.ErrReleased", n, err)
	}
}

// TestTransportLongRequestLineIsAllThatLeaves: net/http writes an HTTP/1
// request line longer than its write buffer (4 KB) straight to the
// connection, before the first WroteHeaderField (Host) at which Transport
// closes a connection it got for an ended lease. The lease ends as the
// request gets its connection (as in
// TestTransportLeaseEndsAsItGetsItsConnection): the request line, or part
// (method and target) may reach the server, as Transport's doc says; no
// header, no token, and so no request a server could act on.
func TestTransportLongRequestLineIsAllThatLeaves(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, _ := io.ReadAll(c) // until the client closes
		got <- b
	}()
	// The connection's Close waits (up to 5 s) for its first Write: the
	// order in which net/http's writeLoop runs before the roundTrip
	// goroutine's own close on the cancel (about 15% of runs without it).
	base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &writeFirstConn{Conn: c, wrote: make(chan struct{})}, nil
	}}
	defer base.CloseIdleConnections()
	lease := memLease(t, "lock:payment:1001")
	var releaseErr error
	rctx := httptrace.WithClientTrace(ctx(t), &httptrace.ClientTrace{GetConn: func(string) {
		releaseErr = lease.Release(ctx(t))
	}})
	target := "http://" + ln.Addr().String() + "/payments/1001?note=" + strings.Repeat("a", 5000)
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, target, strings.NewReader("approve"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: &guard.Transport{Base: base, Lease: laggingLease{lease}}}).Do(req)
	if err == nil {
		resp.Body.Close()
	}
	if releaseErr != nil {
		t.Fatal(releaseErr)
	}
	b := <-got
	if !errors.Is(err, fence.ErrReleased) {
		t.Errorf("Do = %v; want an error matching fence.ErrReleased", err)
	}
	line := "POST /payments/1001?note=" + strings.Repeat("a", 5000) + " HTTP/1.1\r\n"
	if !strings.HasPrefix(line, string(b)) {
		t.Fatalf("lease ended as the request got its connection: the server read %d bytes (%.60q...); want at most the request line", len(b), b)
	}
	t.Logf("the server read %d bytes of the %d-byte request line", len(b), len(line))
}

// TestTransportH2SharedConnSurvivesEndedLease: the connection that
// Transport remembers at GotConn for a request whose lease has ended is,
// over HTTP/2, shared with other clients' streams. It must not be closed:
// another lease's request in flight on it gets its answer, and the next one
// goes out on the same connection (the cancelled stream never writes a
// header, so WroteHeaderField never fires for it).
func TestTransportH2SharedConnSurvivesEndedLease(t *testing.T) {
	holding, letGo := make(chan struct{}), make(chan struct{})
	var guarded atomic.Int32
	srv, client := h2Server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			close(holding)
			<-letGo
			_, _ = w.Write([]byte("held " + r.RemoteAddr))
			return
		}
		if r.URL.Path == "/ended" {
			guarded.Add(1)
		}
		_, _ = w.Write([]byte("ok " + r.RemoteAddr))
	}))
	base := client.Transport
	other := memLease(t, "lock:payment:1002")
	otherClient := &http.Client{Transport: &guard.Transport{Base: base, Lease: other}}
	held := make(chan string, 1)
	go func() {
		resp, err := otherClient.Get(srv.URL + "/hold")
		if err != nil {
			held <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		held <- string(b)
	}()
	<-holding

	lease := memLease(t, "lock:payment:1001")
	var releaseErr error
	rctx := httptrace.WithClientTrace(ctx(t), &httptrace.ClientTrace{GetConn: func(string) {
		releaseErr = lease.Release(ctx(t))
	}})
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		req, err := http.NewRequestWithContext(rctx, method, srv.URL+"/ended", strings.NewReader("approve"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := (&http.Client{Transport: &guard.Transport{Base: base, Lease: laggingLease{lease}}}).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		if releaseErr != nil && !errors.Is(releaseErr, fence.ErrReleased) {
			t.Fatal(releaseErr)
		}
		if !errors.Is(err, fence.ErrReleased) {
			t.Fatalf("Do = %v; want fence.ErrReleased", err)
		}
	}
	close(letGo)
	h := <-held
	resp, err := otherClient.Get(srv.URL + "/next")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(h, "held ") || strings.TrimPrefix(h, "held ") != strings.TrimPrefix(string(b), "ok ") || guarded.Load() != 0 {
		t.Errorf("in flight: %q; next: %q; ended lease's requests at the server: %d; want the held answer and the next on the same connection, none", h, b, guarded.Load())
	}
}

// writeFirstConn is a connection whose Close waits, up to 5 s, for its
// first Write to have happened.
type writeFirstConn struct {
	net.Conn
	once  sync.Once
	wrote chan struct{}
}

func (c *writeFirstConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.once.Do(func() { close(c.wrote) })
	return n, err
}

func (c *writeFirstConn) Close() error {
	select {
	case <-c.wrote:
	case <-time.After(5 * time.Second):
	}
	return c.Conn.Close()
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestTransportH2DetachedContextClosesSharedConn: a Base that hands
// net/http the request with a context detached from cancellation
// (context.WithoutCancel: a wrapper that lets a write finish, say) keeps
// the trace, not the cancel. Over HTTP/2 the stream whose lease ended at
// GotConn then encodes its headers, and Transport closes, at its first
// WroteHeaderField (":authority"), the connection it remembered: the
// HTTP/2 connection, shared by other clients' streams, whose answers are
// lost. Nothing of the ended lease's request is sent (the close comes
// before the HEADERS frame is written), but the other tenants paid (on
// 444062f). An HTTP/2 WroteHeaderField's name starts with ':' (HTTP/1's
// first is "Host"): Transport now tells and does not close.
func TestTransportH2DetachedContextClosesSharedConn(t *testing.T) {
	holding, letGo := make(chan struct{}), make(chan struct{})
	var guarded atomic.Int32
	srv, client := h2Server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			close(holding)
			<-letGo
			_, _ = w.Write([]byte("held"))
			return
		}
		guarded.Add(1)
	}))
	base := client.Transport
	held := make(chan string, 1)
	go func() {
		resp, err := base.RoundTrip(httptest.NewRequestWithContext(ctx(t), http.MethodGet, srv.URL+"/hold", nil))
		if err != nil {
			held <- err.Error()
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			held <- err.Error()
			return
		}
		held <- string(b)
	}()
	<-holding

	detached := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return base.RoundTrip(r.WithContext(context.WithoutCancel(r.Context())))
	})
	lease := memLease(t, "lock:payment:1001")
	var releaseErr error
	rctx := httptrace.WithClientTrace(ctx(t), &httptrace.ClientTrace{GetConn: func(string) {
		releaseErr = lease.Release(ctx(t))
	}})
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, srv.URL+"/payments/1001", strings.NewReader("approve"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: &guard.Transport{Base: detached, Lease: laggingLease{lease}}}).Do(req)
	if err == nil {
		resp.Body.Close()
	}
	if releaseErr != nil {
		t.Fatal(releaseErr)
	}
	close(letGo)
	// The ended lease's request may reach the server here (the Base took
	// away the cancel, and only closing the connection could stop it):
	// logged, not checked.
	t.Logf("ended lease's request: %v; at the server %d times", err, guarded.Load())
	if h := <-held; h != "held" {
		t.Errorf("another client's request in flight on the shared HTTP/2 connection: %q; want \"held\"", h)
	}
}

// TestTransportH2CLeaseEndsAsItGetsItsConnection: the check at
// GotConn over unencrypted HTTP/2 (http.Transport.Protocols with
// UnencryptedHTTP2 only): net/http's h2 client reports GotConn there too,
// and the cancelled stream sends nothing.
func TestTransportH2CLeaseEndsAsItGetsItsConnection(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(guard.TokenHeader) != "" {
			hits.Add(1)
		}
		_, _ = w.Write([]byte(r.Proto))
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	base := &http.Transport{Protocols: new(http.Protocols)}
	base.Protocols.SetUnencryptedHTTP2(true)
	defer base.CloseIdleConnections()
	l, err := memlock.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		lease, err := l.Acquire(ctx(t), "lock:payment:1001", fence.TTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		warm, err := base.RoundTrip(httptest.NewRequestWithContext(ctx(t), http.MethodGet, srv.URL, nil))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(warm.Body)
		warm.Body.Close()
		if string(b) != "HTTP/2.0" {
			t.Fatalf("warm request over %q; want HTTP/2.0", b)
		}
		if i%2 == 1 {
			base.CloseIdleConnections()
		}
		var releaseErr error
		rctx := httptrace.WithClientTrace(ctx(t), &httptrace.ClientTrace{GetConn: func(string) {
			releaseErr = lease.Release(ctx(t))
		}})
		req, err := http.NewRequestWithContext(rctx, http.MethodPost, srv.URL, strings.NewReader("approve"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := (&http.Client{Transport: &guard.Transport{Base: base, Lease: laggingLease{lease}}}).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		if releaseErr != nil {
			t.Fatal(releaseErr)
		}
		if n := hits.Load(); n != 0 || !errors.Is(err, fence.ErrReleased) {
			t.Fatalf("try %d over h2c: server hit %d times, Do = %v; want nothing sent and fence.ErrReleased", i, n, err)
		}
	}
}
