package guard_test

// Attacks on c980492's leaseCheck (a request context that looks at the
// lease until WroteHeaders) and the HTTP/1 close at the first header field,
// by the helper that reviewed it; each failed on c980492.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/http/httputil"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// TestTransportWatchStoppedByEarlierWrite: WroteHeaders stops the watch
// for the whole RoundTrip, once; nothing re-arms it at a later GotConn. A
// Base that writes the request once before sending it (a logging Base with
// httputil.DumpRequestOut, which runs net/http's Transport over a fake
// connection with the request's context, trace and all) stops the watch
// before the real request has its connection. The real request then waits
// for an HTTP/2 stream slot as the lease ends and goes out with the ended
// lease's token: leaseCheck no longer looks at the lease, and the cancel
// from the lease's Context was stopped too.
func TestTransportWatchStoppedByEarlierWrite(t *testing.T) {
	for _, lagging := range []bool{false, true} {
		t.Run(fmt.Sprintf("lagging=%v", lagging), func(t *testing.T) {
			srv, base, guarded, letGo, held := oneStream(t)

			logging := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if _, err := httputil.DumpRequestOut(r, true); err != nil {
					return nil, err
				}
				return base.RoundTrip(r)
			})
			lease := memLease(t, "lock:payment:1001")
			var sent fence.Lease = lease
			if lagging {
				sent = unannouncedLease{lease}
			}
			done := postAsync(&http.Client{Transport: &guard.Transport{Base: logging, Lease: sent}}, srv.URL+"/payments/1001")
			waitForGoroutineIn(t, "awaitOpenSlotForStreamLocked")
			if err := lease.Release(ctx(t)); err != nil {
				t.Fatal(err)
			}
			close(letGo)
			if err := <-held; err != nil {
				t.Fatal(err)
			}
			err := <-done
			if n := guarded.Load(); n != 0 || !errors.Is(err, fence.ErrReleased) {
				t.Errorf("lease released while the request waited for an HTTP/2 stream (after a dump of it): server hit %d times, Do = %v; want nothing sent and fence.ErrReleased", n, err)
			}
		})
	}
}

// h2Frame is a HEADERS frame read by rawH2Server, and its connection.
type h2Frame struct {
	flags  byte
	stream uint32
	conn   *rawH2Conn
}

type rawH2Conn struct {
	mu sync.Mutex
	c  net.Conn
	n  int // the connection's number, from 1
}

func (c *rawH2Conn) send(typ, flags byte, stream uint32, payload []byte) {
	b := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[5:], stream)
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _ = c.c.Write(append(b, payload...))
}

// rawH2Server is an h2c (prior knowledge) server written frame by frame:
// it advertises MAX_CONCURRENT_STREAMS 2, acks SETTINGS and PING, and
// reports every HEADERS frame on heads; the test writes frames back.
type rawH2Server struct {
	ln    net.Listener
	heads chan h2Frame
}

func newRawH2Server(t *testing.T) *rawH2Server {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawH2Server{ln: ln, heads: make(chan h2Frame, 16)}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for n := 1; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go s.serve(t, &rawH2Conn{c: c, n: n})
		}
	}()
	return s
}

func (s *rawH2Server) serve(t *testing.T, c *rawH2Conn) {
	preface := make([]byte, 24)
	if _, err := io.ReadFull(c.c, preface); err != nil {
		return
	}
	c.send(4, 0, 0, []byte{0, 3, 0, 0, 0, 2}) // SETTINGS MAX_CONCURRENT_STREAMS=2
	hdr := make([]byte, 9)
	for {
		if _, err := io.ReadFull(c.c, hdr); err != nil {
			return
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		payload := make([]byte, n)
		if _, err := io.ReadFull(c.c, payload); err != nil {
			return
		}
		typ, flags, stream := hdr[3], hdr[4], binary.BigEndian.Uint32(hdr[5:])&0x7fffffff
		t.Logf("conn %d: frame type %d flags %#x stream %d len %d", c.n, typ, flags, stream, n)
		switch {
		case typ == 4 && flags&1 == 0:
			c.send(4, 1, 0, nil) // SETTINGS ACK
		case typ == 6 && flags&1 == 0:
			c.send(6, 1, 0, payload) // PING ACK
		case typ == 1:
			s.heads <- h2Frame{flags: flags, stream: stream, conn: c}
		}
	}
}

// answer ends f's stream with a 200 and no body (HPACK static index 8).
func (s *rawH2Server) answer(f h2Frame) { f.conn.send(1, 0x5, f.stream, []byte{0x88}) }

func (s *rawH2Server) next(t *testing.T) h2Frame {
	t.Helper()
	select {
	case f := <-s.heads:
		return f
	case <-time.After(10 * time.Second):
		t.Fatal("no HEADERS frame in 10 s")
		return h2Frame{}
	}
}

// TestTransportH2RefusedStreamResendWaitsForSlot: net/http's HTTP/2 client
// sends a request again by itself, on the same connection, when the server
// refuses its stream (RST_STREAM REFUSED_STREAM: "not processed"). The
// first send's WroteHeaders stopped the watch (leaseCheck and the cancel
// from the lease's Context) for good; the resend is checked at its GotConn
// only. It then waits for a stream slot as the lease ends, and goes out
// with the ended lease's token. Transport's doc: "net/http's own resend is
// refused once the lease has ended, as a first send is".
func TestTransportH2RefusedStreamResendWaitsForSlot(t *testing.T) {
	s := newRawH2Server(t)
	base := &http.Transport{Protocols: new(http.Protocols), HTTP2: &http.HTTP2Config{StrictMaxConcurrentRequests: true}}
	base.Protocols.SetUnencryptedHTTP2(true)
	defer base.CloseIdleConnections()
	url := "http://" + s.ln.Addr().String()

	warm := getAsync(t, base, url+"/warm") // the connection, and the server's SETTINGS read
	s.answer(s.next(t))
	if err := <-warm; err != nil {
		t.Fatal(err)
	}
	held := getAsync(t, base, url+"/hold") // another client's request, in one of the two slots
	hold := s.next(t)

	lease := memLease(t, "lock:payment:1001")
	done := postAsync(&http.Client{Transport: &guard.Transport{Base: base, Lease: lease}}, url+"/payments/1001")
	first := s.next(t) // the POST's first send: its headers written, the watch stopped
	if first.flags&1 != 0 || first.conn != hold.conn {
		t.Fatalf("HEADERS %+v: want the POST's (no END_STREAM), on /hold's connection", first)
	}
	// One slot from now on, and the POST's stream refused: net/http sends
	// it again on the same connection, where it waits for /hold's slot.
	first.conn.send(4, 0, 0, []byte{0, 3, 0, 0, 0, 1})      // SETTINGS MAX_CONCURRENT_STREAMS=1
	first.conn.send(3, 0, first.stream, []byte{0, 0, 0, 7}) // RST_STREAM REFUSED_STREAM
	waitForGoroutineIn(t, "awaitOpenSlotForStreamLocked")
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	s.answer(hold)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-s.heads:
		s.answer(f)
		err := <-done
		t.Errorf("lease released while net/http's resend (after REFUSED_STREAM) waited for a stream slot: sent again on stream %d with the ended lease's token, Do = %v; want nothing sent and fence.ErrReleased", f.stream, err)
	case err := <-done:
		if !errors.Is(err, fence.ErrReleased) {
			t.Errorf("Do = %v; want fence.ErrReleased", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("neither a resend nor Do's return in 10 s")
	}
}

// TestTransportHedgedAttemptsShareConn: a Base that sends a request twice
// at once (hedging: two attempts with the request's context, the trace
// and all, the first answer wins) has two GotConns before either first
// header field. Transport keeps one connection, the last got: the lease
// ending then, the first attempt to write its first header closes the
// other attempt's connection, and its own request goes out with the ended
// lease's token.
func TestTransportHedgedAttemptsShareConn(t *testing.T) {
	t.Skip("limit, documented (Transport's doc): a Base that runs attempts of one request side by side, with one trace; " +
		"Transport cannot tell one attempt's first header field from another's, so an attempt whose first field comes " +
		"after the other's, the lease ending between them, is not looked at (sent on 3 of 20 tries)")
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(guard.TokenHeader) != "" {
			hits.Add(1)
		}
	}))
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	var hedges sync.WaitGroup // done when both attempts of a request have ended
	hedged := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		type result struct {
			resp *http.Response
			err  error
		}
		out := make(chan result, 2)
		for range 2 {
			rr := r.Clone(r.Context())
			rr.Body, _ = r.GetBody()
			go func() {
				resp, err := base.RoundTrip(rr)
				out <- result{resp, err}
			}()
		}
		first := <-out
		hedges.Add(1)
		go func() {
			defer hedges.Done()
			if late := <-out; late.err == nil {
				late.resp.Body.Close()
			}
		}()
		return first.resp, first.err
	})
	sent := 0
	for i := range 20 {
		hits.Store(0)
		lease := memLease(t, "lock:payment:1001")
		var got atomic.Int32
		both := make(chan struct{})
		var releaseErr error
		rctx := httptrace.WithClientTrace(ctx(t), &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) {
			if got.Add(1) == 2 {
				releaseErr = lease.Release(ctx(t))
				close(both)
			}
			<-both
		}})
		req, err := http.NewRequestWithContext(rctx, http.MethodPost, srv.URL, strings.NewReader("approve"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := (&http.Client{Transport: &guard.Transport{Base: hedged, Lease: laggingLease{lease}}}).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		if releaseErr != nil {
			t.Fatal(releaseErr)
		}
		// The attempt that lost may still be out: wait for it to end. An
		// attempt whose request went out ends with the server's answer, sent
		// once the handler has counted the hit.
		ended := make(chan struct{})
		go func() { hedges.Wait(); close(ended) }()
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Fatalf("try %d: the hedged attempt that lost did not end in 10 s", i)
		}
		if n := hits.Load(); n != 0 {
			sent++
			t.Logf("try %d: server hit %d times with the ended lease's token, Do = %v", i, n, err)
		}
	}
	if sent != 0 {
		t.Errorf("lease released as two hedged attempts got their connections: sent on %d of 20 tries; want none", sent)
	}
}

// reportingLease ends itself at its first Err once due is set (its
// deadline has passed, before its timer ran) and reports the end to
// onEnd on the caller's goroutine: as memlock, pglock, zklock and
// redislock do (memlock.Options.Observer: "called ... on the goroutine
// that ended the lease (the caller of Release, Extend, Err or Remove...)").
type reportingLease struct {
	fence.Lease
	due   atomic.Bool
	once  sync.Once
	onEnd func()
}

func (l *reportingLease) Err() error {
	if l.due.Load() {
		l.once.Do(func() {
			_ = l.Lease.Release(context.Background())
			l.onEnd()
		})
	}
	return l.Lease.Err()
}

// TestTransportObserverRunsInsideHTTP2Write: leaseCheck.Done called
// lease.Err (on c980492) from wherever net/http asks the request's context, and the
// last time is in encodeAndWriteHeaders, with the connection's write mutex
// (and its new-request lock) held. A lease whose end is found by that Err
// reports it to its Observer there, inside net/http's critical section:
// an Observer that tells the service through the application's client
// ("lease lost", over the same HTTP/2 connection) waits for that lock for
// ever, and every stream on the connection with it.
func TestTransportObserverRunsInsideHTTP2Write(t *testing.T) {
	srv, base, guarded, letGo, held := oneStream(t)

	notified := make(chan error, 1)
	lease := &reportingLease{Lease: memLease(t, "lock:payment:1001")}
	lease.onEnd = func() { // the Observer: tell the service, 3 s at most
		c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		resp, err := base.RoundTrip(httptest.NewRequestWithContext(c, http.MethodPost, srv.URL+"/lease-lost", nil))
		if err == nil {
			resp.Body.Close()
		}
		notified <- err
	}
	done := postAsync(&http.Client{Transport: &guard.Transport{Base: base, Lease: lease}}, srv.URL+"/payments/1001")
	waitForGoroutineIn(t, "awaitOpenSlotForStreamLocked")
	lease.due.Store(true) // its deadline passes while it waits for the slot
	start := time.Now()
	close(letGo)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	err := <-done
	took := time.Since(start)
	// Transport does not ask the lease's Err where net/http holds the
	// connection's locks (leaseCheck reads the lease's Context): this
	// lease's end, which only its Err finds, is not seen before the write,
	// and the request may go out (the server's check is what stops a
	// holder whose lease ended unseen). Whenever the end is found, the
	// Observer's own request must go through.
	_ = lease.Err()
	nerr := <-notified
	if nerr != nil || took > time.Second {
		t.Errorf("the lease's end found by Err: Do = %v after %v, server hit %d times; the Observer's request: %v; want Do at once and the Observer's request answered", err, took.Round(time.Millisecond), guarded.Load(), nerr)
	}
}
