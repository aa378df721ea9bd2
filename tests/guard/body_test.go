package guard_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fence/guard"
)

// sqlStores returns a counting SQLStore per database, and the database.
func sqlStores(t *testing.T) map[string]struct {
	store *countingStore
	db    *sql.DB
} {
	all := map[string]struct {
		store *countingStore
		db    *sql.DB
	}{}
	for name, db := range databases(t) {
		if err := guard.CreateTables(ctx(t), db); err != nil {
			t.Fatal(err)
		}
		all[name] = struct {
			store *countingStore
			db    *sql.DB
		}{&countingStore{Store: guard.SQLStore{DB: db}}, db}
	}
	return all
}

// A body over MaxBody, announced by its Content-Length (with or without
// Expect: 100-continue) or sent chunked, is answered 413 before the store
// is asked: nothing is written, the last
// token stays, and the token refused is not spent. A body of exactly
// MaxBody is served.
func TestBodyOverLimit(t *testing.T) {
	for name, s := range sqlStores(t) {
		t.Run(name, func(t *testing.T) {
			var served atomic.Int32
			mw := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource, MaxBody: 8})
			srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				served.Add(1)
				_, _ = io.Copy(w, r.Body)
			})))
			defer srv.Close()

			if code, _, body := postBody(t, srv.Client(), srv.URL, "5", []byte("12345678"), false); code != http.StatusOK || body != "12345678" {
				t.Fatalf("body of MaxBody bytes: %d %q, want 200 and the body", code, body)
			}
			calls := s.store.calls.Load()
			for _, chunked := range []bool{false, true} {
				code, p, body := postBody(t, srv.Client(), srv.URL, "6", []byte("123456789"), chunked)
				if code != http.StatusRequestEntityTooLarge || p.Type != guard.ProblemTooLarge || p.Resource != "payment:1001" {
					t.Errorf("body of MaxBody+1 bytes (chunked %v): %d %s, want 413 %s", chunked, code, body, guard.ProblemTooLarge)
				}
			}
			// Expect: 100-continue and a Content-Length over the limit: 413
			// at once, and no 100 Continue inviting the body.
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\n%s: 6\r\nExpect: 100-continue\r\nContent-Length: 1000000000\r\n\r\n",
				guard.TokenHeader); err != nil {
				t.Fatal(err)
			}
			if code, _ := answer(t, conn); code != http.StatusRequestEntityTooLarge {
				t.Errorf("Expect: 100-continue with a body over the limit: %d, want 413 before any body", code)
			}
			if n := s.store.calls.Load() - calls; n != 0 {
				t.Errorf("the store was asked %d times for bodies over the limit, want 0", n)
			}
			if n := served.Load(); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
			if last := lastToken(t, s.db, "http:payment:1001"); last != 5 {
				t.Errorf("last token %d after the 413s, want 5", last)
			}
			if code, _, body := postBody(t, srv.Client(), srv.URL, "6", []byte("ok"), false); code != http.StatusOK {
				t.Errorf("token 6 after its 413: %d %s, want 200 (not spent)", code, body)
			}
		})
	}
}

// A request whose client goes away mid-body, or whose context ends while
// its body is still coming, is not taken to the store: no transaction, no
// token accepted, no handler. The context's end stops the read at once,
// without waiting for the client.
func TestBodyUnfinished(t *testing.T) {
	for name, s := range sqlStores(t) {
		t.Run(name, func(t *testing.T) {
			obs := &decisions{}
			mw := guard.Middleware(s.store, guard.HTTPOptions{
				Resource: func(r *http.Request) (string, error) { return "payment:" + r.PathValue("id"), nil },
				Observer: obs,
			})
			// Buffered for every request the test sends, so that a failing
			// test does not leave the server blocked.
			started, done := make(chan struct{}, 2), make(chan struct{}, 2)
			cancels := make(chan context.CancelFunc, 2)
			mux := http.NewServeMux()
			mux.Handle("POST /payments/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c, cancel := context.WithCancel(r.Context())
				defer cancel()
				cancels <- cancel
				bodyStarted(mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
					t.Error("handler ran without its whole body")
				})), started).ServeHTTP(w, r.WithContext(c))
				done <- struct{}{}
			}))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			addr := srv.Listener.Addr().String()

			t.Run("client gone", func(t *testing.T) {
				conn := startPost(t, addr, "/payments/1", "5", 4, "ab")
				<-cancels
				wait(t, started, "the body to start")
				_ = conn.Close()
				wait(t, done, "the middleware to return")
			})
			t.Run("context ended", func(t *testing.T) {
				conn := startPost(t, addr, "/payments/2", "5", 4, "ab")
				cancel := <-cancels
				wait(t, started, "the body to start")
				cancel()
				wait(t, done, "the middleware to return") // the client has not sent the rest
				if code, _ := answer(t, conn); code != http.StatusBadRequest {
					t.Errorf("got %d, want 400", code)
				}
			})
			if n := s.store.calls.Load(); n != 0 {
				t.Errorf("the store was asked %d times, want 0", n)
			}
			for _, res := range []string{"http:payment:1", "http:payment:2"} {
				if last := lastToken(t, s.db, res); last != 0 {
					t.Errorf("%s: token %d accepted, want none", res, last)
				}
			}
			obs.mu.Lock()
			defer obs.mu.Unlock()
			if len(obs.events) != 0 {
				t.Errorf("observer told of %v, want nothing", obs.events)
			}
		})
	}
}

// With a negative MaxBody the handler reads the body from the client
// itself, inside the fenced transaction (the old behaviour, where the
// client chooses how long the transaction lasts), and no size is imposed.
func TestNegativeMaxBodyStreams(t *testing.T) {
	for name, s := range sqlStores(t) {
		t.Run(name, func(t *testing.T) {
			entered := make(chan struct{}, 2)
			mw := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource, MaxBody: -1})
			srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if _, ok := guard.TxFrom(r.Context()); !ok {
					t.Error("handler outside the fenced transaction")
				}
				if r.ContentLength == 4 {
					entered <- struct{}{}
				}
				b, err := io.ReadAll(r.Body)
				if err != nil {
					http.Error(w, "body", http.StatusBadRequest)
					return
				}
				_, _ = io.WriteString(w, strconv.Itoa(len(b)))
			})))
			defer srv.Close()

			conn := startPost(t, srv.Listener.Addr().String(), "/", "5", 4, "ab")
			wait(t, entered, "the handler to run before the body is whole")
			if _, err := io.WriteString(conn, "cd"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(b) != "4" {
				t.Errorf("streamed body: %d %q, want 200 \"4\"", resp.StatusCode, b)
			}

			big := make([]byte, guard.DefaultMaxBody+1)
			if code, _, body := postBody(t, srv.Client(), srv.URL, "6", big, true); code != http.StatusOK || body != strconv.Itoa(len(big)) {
				t.Errorf("body over DefaultMaxBody: %d %q, want 200", code, body)
			}
		})
	}
}

// The handler reads the whole body, whether it came with a Content-Length
// or chunked, up to DefaultMaxBody, and the request it gets says so:
// ContentLength is the body's length, GetBody gives the body again, and
// the body is no longer chunked.
func TestHandlerSeesWholeBody(t *testing.T) {
	big := make([]byte, guard.DefaultMaxBody)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	stores := map[string]guard.Store{"memory": &guard.MemoryStore{}}
	for name, s := range sqlStores(t) {
		stores["sql-"+name] = s.store
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			var want atomic.Pointer[[]byte]
			mw := guard.Middleware(store, guard.HTTPOptions{Resource: oneResource})
			srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, err := io.ReadAll(r.Body)
				if err != nil {
					t.Errorf("reading the body: %v", err)
				}
				w2 := *want.Load()
				if !bytes.Equal(b, w2) || r.ContentLength != int64(len(w2)) || len(r.TransferEncoding) != 0 {
					t.Errorf("handler saw %d bytes (equal %v), ContentLength %d, TransferEncoding %q; want %d bytes",
						len(b), bytes.Equal(b, w2), r.ContentLength, r.TransferEncoding, len(w2))
				}
				if len(w2) == 0 {
					return // the server's http.NoBody, as it came
				}
				if r.GetBody == nil {
					t.Error("no GetBody")
					return
				}
				again, err := r.GetBody()
				if err != nil {
					t.Error(err)
					return
				}
				if b, _ := io.ReadAll(again); !bytes.Equal(b, w2) {
					t.Errorf("GetBody gave %d bytes, want %d", len(b), len(w2))
				}
			})))
			defer srv.Close()
			for i, tc := range []struct {
				body    []byte
				chunked bool
			}{
				{[]byte("abc"), false},
				{[]byte("abc"), true},
				{big, false},
				{big, true},
				{nil, true}, // chunked, and empty
			} {
				want.Store(&tc.body)
				if code, _, body := postBody(t, srv.Client(), srv.URL, strconv.Itoa(i+1), tc.body, tc.chunked); code != http.StatusOK {
					t.Errorf("%d bytes, chunked %v: %d %s, want 200", len(tc.body), tc.chunked, code, body)
				}
			}
		})
	}
}
