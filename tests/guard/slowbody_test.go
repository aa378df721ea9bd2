package guard_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// bodyStarted wraps next so that started receives a value once the body's
// first bytes have been read (by Middleware or by the handler): from then
// on the server waits for the rest of the body.
func bodyStarted(next http.Handler, started chan<- struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = &signalBody{ReadCloser: r.Body, started: started}
		next.ServeHTTP(w, r)
	})
}

type signalBody struct {
	io.ReadCloser
	started chan<- struct{}
	once    sync.Once
}

func (b *signalBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.once.Do(func() { b.started <- struct{}{} })
	}
	return n, err
}

// countingStore counts the calls of Do: the requests taken to the store.
type countingStore struct {
	guard.Store
	calls atomic.Int32
}

func (s *countingStore) Do(ctx context.Context, resource string, token fence.Token, fn func(context.Context) error) error {
	s.calls.Add(1)
	return s.Store.Do(ctx, resource, token, fn)
}

// lastToken returns the last token accepted for resource, 0 if none.
func lastToken(t *testing.T, db *sql.DB, resource string) int64 {
	t.Helper()
	var last int64
	err := db.QueryRowContext(ctx(t), `SELECT token FROM fence_tokens WHERE resource = $1`, resource).Scan(&last)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatal(err)
	}
	return last
}

// startPost dials addr and sends a POST's headers, with the given
// Content-Length, and the first part of its body.
func startPost(t *testing.T, addr, path, token string, length int, part string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\n%s: %s\r\nContent-Length: %d\r\n\r\n%s",
		path, guard.TokenHeader, token, length, part); err != nil {
		t.Fatal(err)
	}
	return conn
}

// wait receives from c, or fails the test after 10 s.
func wait[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case v := <-c:
		return v
	case <-timer.C:
		t.Fatalf("still waiting for %s after 10 s", what)
		panic("unreachable")
	}
}

// postBody posts body to url with token; chunked sends it without a
// Content-Length.
func postBody(t *testing.T, c *http.Client, url, token string, body []byte, chunked bool) (int, guard.Problem, string) {
	t.Helper()
	var r io.Reader = bytes.NewReader(body)
	if chunked {
		r = io.MultiReader(r) // a reader of unknown length
	}
	req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, url, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(guard.TokenHeader, token)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var p guard.Problem
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, p, string(b)
}

// TestSlowBodyDoesNotHoldOtherResources: a client (a paused worker, or an
// attacker with one valid token) sends a fenced request's headers and then
// trickles its body. Were the body read inside SQLStore's transaction, on
// SQLite, whose one writer holds the whole file, the upload would hold the
// write lock: a request for another resource would wait the busy timeout
// (10 s) and get 503, and how long a transaction lasts would be the
// client's to choose. A request for another resource must be served while
// the slow body is still coming.
func TestSlowBodyDoesNotHoldOtherResources(t *testing.T) {
	db, err := sql.Open("sqlite", guard.SQLiteDSN(filepath.Join(t.TempDir(), "slow.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 2)
	mw := guard.Middleware(guard.SQLStore{DB: db}, guard.HTTPOptions{
		Resource: func(r *http.Request) (string, error) { return "payment:" + r.PathValue("id"), nil },
	})
	bodies := make(chan string, 2)
	mux := http.NewServeMux()
	mux.Handle("POST /payments/{id}", bodyStarted(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "body", http.StatusBadRequest)
		}
		bodies <- string(b)
	})), started))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	conn := startPost(t, srv.Listener.Addr().String(), "/payments/1", "5", 4, "ab")
	wait(t, started, "payment 1's body to start") // the server waits for the rest of payment 1's body

	start := time.Now()
	code, _, body := send(t, srv.Client(), srv.URL+"/payments/2", guard.TokenHeader, "1")
	if took := time.Since(start); code != http.StatusOK || took > 3*time.Second {
		t.Errorf("payment 2 while payment 1's body is still coming: %d %q after %v, want 200 at once", code, body, took)
	}

	if _, err := io.WriteString(conn, "cd"); err != nil {
		t.Fatal(err)
	}
	if code, _ := answer(t, conn); code != http.StatusOK {
		t.Errorf("payment 1 once its body arrived: %d, want 200", code)
	}
	got := map[string]bool{}
	for range 2 {
		got[wait(t, bodies, "a handler")] = true
	}
	if !got["abcd"] || !got[""] {
		t.Errorf("handlers saw bodies %v, want abcd and the empty one", got)
	}
}
