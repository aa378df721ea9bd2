package guard_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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
	done := make(chan error, 1)
	go func() {
		resp, err := c.Post(srv.URL, "text/plain", strings.NewReader("approve"))
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
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
