package guard_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// clock is a fixed time for tests of MaxAhead: 1.8e15 µs since the epoch.
var clock = time.UnixMicro(1_800_000_000_000_000)

func fixedClock() time.Time { return clock }

// guards returns a middleware per kind of store: Middleware over a
// MemoryStore and over SQLStore on PostgreSQL and SQLite, and Gate over a
// redisstore.Store.
func guards(t *testing.T, opts guard.HTTPOptions) map[string]func(http.Handler) http.Handler {
	all := map[string]func(http.Handler) http.Handler{
		"memory":     guard.Middleware(&guard.MemoryStore{}, opts),
		"redis-gate": guard.Gate(redisStore(t), opts),
	}
	for name, db := range databases(t) {
		if err := guard.CreateTables(ctx(t), db); err != nil {
			t.Fatal(err)
		}
		all["sql-"+name] = guard.Middleware(guard.SQLStore{DB: db}, opts)
	}
	return all
}

func redisStore(t *testing.T) redisstore.Store {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = client.Close() })
	return redisstore.Store{Client: client, Prefix: "guardtest:" + strconv.FormatInt(time.Now().UnixNano(), 36)}
}

// send posts to url with the given headers (name, value pairs; a name may
// repeat) and returns the status, the problem body of a rejection and the
// raw body.
func send(t *testing.T, c *http.Client, url string, headers ...string) (int, guard.Problem, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var p guard.Problem
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		if err := json.Unmarshal(body, &p); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, p, string(body)
}

func TestMiddleware(t *testing.T) {
	opts := guard.HTTPOptions{Resource: guard.ResourceFromHeader, Now: fixedClock}
	for name, mw := range guards(t, opts) {
		t.Run(name, func(t *testing.T) {
			var served atomic.Int32
			srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				served.Add(1)
				_, _ = io.WriteString(w, "approved")
			})))
			defer srv.Close()
			for _, tc := range []struct {
				resource, token string
				want            int
			}{
				{"payment:1001", "", http.StatusBadRequest},
				{"payment:1001", "abc", http.StatusBadRequest},
				{"payment:1001", "0", http.StatusBadRequest},
				{"payment:1001", "-5", http.StatusBadRequest},
				{"payment:1001", "+5", http.StatusBadRequest},
				{"payment:1001", "007", http.StatusBadRequest},
				{"payment:1001", "9223372036854775808", http.StatusBadRequest}, // int64 max + 1
				{"payment:1001", "9223372036854775807", http.StatusBadRequest}, // far ahead of the clock
				{"payment:1001", "1800003600000001", http.StatusBadRequest},    // clock + 1 h + 1 µs
				{"", "5", http.StatusBadRequest},
				{"pay{ment}", "5", http.StatusBadRequest},
				{"payment:1001", "5", http.StatusOK},
				{"payment:1001", "3", http.StatusConflict},
				{"payment:1001", "5", http.StatusConflict},
				{"payment:1002", "3", http.StatusOK}, // resources are independent
				{"payment:1001", "1800000000000000", http.StatusOK},
				{"payment:1001", "1800003600000000", http.StatusOK}, // clock + 1 h exactly
				{"payment:1001", "1800003599999999", http.StatusConflict},
			} {
				var h []string
				if tc.resource != "" {
					h = append(h, guard.ResourceHeader, tc.resource)
				}
				if tc.token != "" {
					h = append(h, guard.TokenHeader, tc.token)
				}
				code, p, body := send(t, srv.Client(), srv.URL, h...)
				if code != tc.want {
					t.Fatalf("%s token %q: %d %s, want %d", tc.resource, tc.token, code, body, tc.want)
				}
				if code == http.StatusConflict && (p.Type != guard.ProblemStale || p.Last <= 0) {
					t.Fatalf("409 body %+v", p)
				}
				if code == http.StatusOK && body != "approved" {
					t.Fatalf("200 body %q", body)
				}
			}
			if n := served.Load(); n != 4 {
				t.Fatalf("handler ran %d times, want 4 (only accepted requests)", n)
			}
		})
	}
}

// hookStore tells entered which token reached Do, before the store looks
// at it.
type hookStore struct {
	guard.Store
	entered func(fence.Token)
}

func (h hookStore) Do(ctx context.Context, resource string, token fence.Token, fn func(context.Context) error) error {
	h.entered(token)
	return h.Store.Do(ctx, resource, token, fn)
}

// interleave plays issue 10's hole 2: token 5 is admitted and its handler
// pauses; token 7 arrives; once 7 has either finished (the check did not
// hold it back) or reached the store's Do, 5's handler writes. It returns
// the final state. newMW builds the middleware; it gets a hook to call
// when a token enters the store.
func interleave(t *testing.T, newMW func(entered func(fence.Token)) func(http.Handler) http.Handler,
	write func(r *http.Request, token int64) error, read func() int64) int64 {
	t.Helper()
	aIn, releaseA, bEntered := make(chan struct{}), make(chan struct{}), make(chan struct{})
	mw := newMW(func(token fence.Token) {
		if token == 7 {
			close(bEntered)
		}
	})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, _ := guard.ParseToken(r.Header.Get(guard.TokenHeader))
		if token == 5 {
			close(aIn)
			<-releaseA
		}
		if err := write(r, int64(token)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})))
	defer srv.Close()
	codes := make(chan int, 2)
	go func() { code, _, _ := send(t, srv.Client(), srv.URL, guard.TokenHeader, "5"); codes <- code }()
	<-aIn
	bDone := make(chan int, 1)
	go func() { code, _, _ := send(t, srv.Client(), srv.URL, guard.TokenHeader, "7"); bDone <- code }()
	select {
	case code := <-bDone: // 7 was not held back: it has written already
		codes <- code
		close(releaseA)
	case <-bEntered: // 7 reached the store while 5 holds the resource
		close(releaseA)
		codes <- <-bDone
	}
	for range 2 {
		if code := <-codes; code != http.StatusOK {
			t.Fatalf("status %d, want 200", code)
		}
	}
	return read()
}

func oneResource(*http.Request) (string, error) { return "payment:1001", nil }

// Hole 2: the check and the handler's writes are ordered, so an older
// token cannot write after a newer one was accepted.
func TestMiddlewareOrdersWrites(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		var state atomic.Int64
		store := &guard.MemoryStore{}
		got := interleave(t, func(entered func(fence.Token)) func(http.Handler) http.Handler {
			return guard.Middleware(hookStore{store, entered}, guard.HTTPOptions{Resource: oneResource})
		}, func(_ *http.Request, token int64) error { state.Store(token); return nil }, state.Load)
		if got != 7 {
			t.Fatalf("final state %d, want 7", got)
		}
	})
	for name, db := range databases(t) {
		t.Run("sql-"+name, func(t *testing.T) {
			if err := guard.CreateTables(ctx(t), db); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx(t), `CREATE TABLE state (id INTEGER PRIMARY KEY, token BIGINT NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx(t), `INSERT INTO state (id, token) VALUES (1, 0)`); err != nil {
				t.Fatal(err)
			}
			got := interleave(t, func(entered func(fence.Token)) func(http.Handler) http.Handler {
				return guard.Middleware(hookStore{guard.SQLStore{DB: db}, entered}, guard.HTTPOptions{Resource: oneResource})
			}, func(r *http.Request, token int64) error {
				tx, ok := guard.TxFrom(r.Context())
				if !ok {
					return errors.New("no fenced transaction in the request's context")
				}
				_, err := tx.ExecContext(r.Context(), `UPDATE state SET token = $1 WHERE id = 1`, token)
				return err
			}, func() int64 {
				var token int64
				if err := db.QueryRowContext(ctx(t), `SELECT token FROM state WHERE id = 1`).Scan(&token); err != nil {
					t.Fatal(err)
				}
				return token
			})
			if got != 7 {
				t.Fatalf("final state %d, want 7", got)
			}
		})
	}
}

// Gate is what the old Middleware was, and says so: the same interleaving
// leaves the older token's state.
func TestGateDoesNotOrderWrites(t *testing.T) {
	var state atomic.Int64
	store := redisStore(t)
	got := interleave(t, func(func(fence.Token)) func(http.Handler) http.Handler {
		return guard.Gate(store, guard.HTTPOptions{Resource: oneResource})
	}, func(_ *http.Request, token int64) error { state.Store(token); return nil }, state.Load)
	if got != 5 {
		t.Fatalf("final state %d: the gate now orders writes; update its docs", got)
	}
}

// Hole 3: a forged token at the int64 maximum is refused, so the real
// tokens of a fence lock keep working after it.
func TestForgedTokenCannotBlockResource(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer client.Close()
	locker, err := redislock.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, mw := range guards(t, guard.HTTPOptions{Resource: oneResource}) {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
			defer srv.Close()
			code, p, _ := send(t, srv.Client(), srv.URL, guard.TokenHeader, "9223372036854775807")
			if code != http.StatusBadRequest || p.Type != guard.ProblemInvalid {
				t.Fatalf("forged token: %d %+v, want 400", code, p)
			}
			for range 2 {
				lease, err := locker.Acquire(ctx(t), "lock:forged:"+name, fence.TTL(10*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				code, _, body := send(t, srv.Client(), srv.URL, guard.TokenHeader, strconv.FormatInt(int64(lease.Token()), 10))
				if code != http.StatusOK {
					t.Fatalf("real token %d: %d %s", lease.Token(), code, body)
				}
				if err := lease.Release(ctx(t)); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestMaxAhead(t *testing.T) {
	handler := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, tc := range []struct {
		maxAhead time.Duration
		token    string
		want     int
	}{
		{0, "1800003600000000", http.StatusOK}, // the default, one hour
		{0, "1800003600000001", http.StatusBadRequest},
		{time.Minute, "1800000060000000", http.StatusOK},
		{time.Minute, "1800000060000001", http.StatusBadRequest},
		{-1, "9223372036854775807", http.StatusOK}, // off
		{0, "9223372036854775807", http.StatusOK},  // a clock near the end of int64 must not overflow
	} {
		now := fixedClock
		if tc.token == "9223372036854775807" {
			now = func() time.Time { return time.UnixMicro(math.MaxInt64 - 10) }
		}
		mw := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{Resource: oneResource, MaxAhead: tc.maxAhead, Now: now})
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.Header.Set(guard.TokenHeader, tc.token)
		mw(handler).ServeHTTP(w, req)
		if w.Code != tc.want {
			t.Errorf("MaxAhead %v, token %s: %d, want %d", tc.maxAhead, tc.token, w.Code, tc.want)
		}
	}
}

// Hole 3: the server chooses the resource; the client's Fence-Resource
// header is ignored unless the server opts in.
func TestResourceChosenByServer(t *testing.T) {
	opts := guard.HTTPOptions{Resource: func(r *http.Request) (string, error) {
		id := r.PathValue("id")
		if _, err := strconv.Atoi(id); err != nil {
			return "", errors.New("payment id is not a number")
		}
		return "payment:" + id, nil
	}}
	for name, mw := range guards(t, opts) {
		t.Run(name, func(t *testing.T) {
			var served atomic.Int32
			mux := http.NewServeMux()
			mux.Handle("POST /payments/{id}", mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) })))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			for _, tc := range []struct {
				path, resource, token string
				want                  int
			}{
				{"/payments/1", "payment:2", "10", http.StatusOK}, // the header names another payment: ignored
				{"/payments/2", "", "5", http.StatusOK},           // so payment 2 is not blocked by token 10
				{"/payments/1", "payment:3", "9", http.StatusConflict},
				{"/payments/x", "payment:3", "50", http.StatusBadRequest}, // the chooser fails
			} {
				h := []string{guard.TokenHeader, tc.token}
				if tc.resource != "" {
					h = append(h, guard.ResourceHeader, tc.resource)
				}
				code, p, body := send(t, srv.Client(), srv.URL+tc.path, h...)
				if code != tc.want {
					t.Fatalf("%s token %s: %d %s, want %d", tc.path, tc.token, code, body, tc.want)
				}
				if code == http.StatusBadRequest && (p.Type != guard.ProblemResource || strings.Contains(body, "number")) {
					t.Fatalf("chooser's error: body %s", body)
				}
			}
			if n := served.Load(); n != 2 {
				t.Fatalf("handler ran %d times, want 2", n)
			}
		})
	}
}

// Hole 3: HTTP's fence_tokens rows live under "http:", so a request does not
// block Tx on the same name unless Tx is given the prefixed name.
func TestNamespaceSeparatesHTTPFromTx(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			if err := guard.CreateTables(ctx(t), db); err != nil {
				t.Fatal(err)
			}
			for i, ns := range []string{"", "api/"} {
				mw := guard.Middleware(guard.SQLStore{DB: db}, guard.HTTPOptions{Resource: oneResource, Namespace: ns})
				w := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodPost, "/", nil)
				req.Header.Set(guard.TokenHeader, "1000")
				mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					t.Fatalf("namespace %q: %d %s", ns, w.Code, w.Body)
				}
				if ns == "" {
					ns = guard.DefaultNamespace
				}
				noop := func(*sql.Tx) error { return nil }
				if err := guard.Tx(ctx(t), db, "payment:1001", fence.Token(5+i), noop); err != nil {
					t.Fatalf("namespace %q: Tx on the unprefixed name: %v, want nil", ns, err)
				}
				if err := guard.Tx(ctx(t), db, ns+"payment:1001", 5, noop); !errors.Is(err, guard.ErrStale) {
					t.Fatalf("Tx on %q: %v, want ErrStale (shared on purpose)", ns+"payment:1001", err)
				}
			}
		})
	}
}

// syncBuffer is a bytes.Buffer for a logger that handlers write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Hole 8: a failing store answers 503 with a generic body; the cause (here
// a dial error naming an address, or a closed database) goes to the log.
func TestStoreFailureBodyIsGeneric(t *testing.T) {
	closed, err := sql.Open("sqlite", "file:"+t.TempDir()+"/closed.db")
	if err != nil {
		t.Fatal(err)
	}
	_ = closed.Close()
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer down.Close()
	for name, tc := range map[string]struct {
		store   func(guard.HTTPOptions) func(http.Handler) http.Handler
		secrets []string
	}{
		"sql-closed": {func(o guard.HTTPOptions) func(http.Handler) http.Handler {
			return guard.Middleware(guard.SQLStore{DB: closed}, o)
		}, []string{"closed"}},
		"redis-down": {func(o guard.HTTPOptions) func(http.Handler) http.Handler {
			return guard.Gate(redisstore.Store{Client: down}, o)
		}, []string{"127.0.0.1:1", "refused"}},
	} {
		t.Run(name, func(t *testing.T) {
			var log syncBuffer
			mw := tc.store(guard.HTTPOptions{Resource: oneResource, Logger: slog.New(slog.NewTextHandler(&log, nil))})
			w := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodPost, "/", nil)
			req.Header.Set(guard.TokenHeader, "5")
			mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("handler ran") })).ServeHTTP(w, req)
			if w.Code != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503", w.Code)
			}
			for _, s := range tc.secrets {
				if strings.Contains(w.Body.String(), s) {
					t.Errorf("body %s carries %q", w.Body, s)
				}
				if !strings.Contains(log.String(), s) {
					t.Errorf("log %q lacks %q", log.String(), s)
				}
			}
			if !strings.Contains(log.String(), "level=ERROR") {
				t.Errorf("log %q: want level ERROR", log.String())
			}
		})
	}
}

func TestTransportAttachesLeaseToken(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer client.Close()
	locker, err := redislock.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	var seen atomic.Value
	mw := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{Resource: guard.ResourceFromHeader})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get(guard.ResourceHeader) + "=" + r.Header.Get(guard.TokenHeader))
	})))
	defer srv.Close()

	lease, err := locker.Acquire(ctx(t), "lock:transport", fence.TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &guard.Transport{Base: srv.Client().Transport, Lease: lease, Resource: "payment:1001"}}
	resp, err := c.Post(srv.URL, "text/plain", strings.NewReader("approve"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := "payment:1001=" + strconv.FormatInt(int64(lease.Token()), 10)
	if resp.StatusCode != http.StatusOK || seen.Load() != want {
		t.Fatalf("status %d, server saw %v, want %s", resp.StatusCode, seen.Load(), want)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	_, err = c.Post(srv.URL, "text/plain", strings.NewReader("approve"))
	if !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("request after Release: %v, want ErrReleased", err)
	}
}

func TestParseToken(t *testing.T) {
	good := map[string]fence.Token{"1": 1, "42": 42, "9223372036854775807": 1<<63 - 1}
	for s, want := range good {
		if got, err := guard.ParseToken(s); err != nil || got != want {
			t.Errorf("ParseToken(%q) = %d, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "0", "-1", "+1", "01", "1.5", "1e3", " 1", "9223372036854775808", "99999999999999999999"} {
		if _, err := guard.ParseToken(s); !errors.Is(err, guard.ErrInvalidToken) {
			t.Errorf("ParseToken(%q) = %v, want ErrInvalidToken", s, err)
		}
	}
}

// A chooser that returns "" is a mistake, the commonest being Middleware
// wrapped around a ServeMux, where r.PathValue is still empty: every
// request would share the one resource named by the namespace alone
// ("http:"), and tokens of different locks would be compared with each
// other (here a payment's request is refused as stale because of
// another payment's token). It is refused as a chooser's failure instead.
func TestEmptyResourceRefused(t *testing.T) {
	opts := guard.HTTPOptions{Resource: func(r *http.Request) (string, error) { return r.PathValue("id"), nil }}
	for name, mw := range guards(t, opts) {
		t.Run(name, func(t *testing.T) {
			var served atomic.Int32
			mux := http.NewServeMux()
			mux.Handle("POST /payments/{id}", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) }))
			srv := httptest.NewServer(mw(mux)) // the middleware outside the mux: no path values yet
			defer srv.Close()
			for _, tc := range []struct{ path, token string }{{"/payments/1", "10"}, {"/payments/2", "5"}} {
				code, p, body := send(t, srv.Client(), srv.URL+tc.path, guard.TokenHeader, tc.token)
				if code != http.StatusBadRequest || p.Type != guard.ProblemResource {
					t.Fatalf("%s token %s with an empty resource: %d %s, want 400 %s", tc.path, tc.token, code, body, guard.ProblemResource)
				}
			}
			if n := served.Load(); n != 0 {
				t.Fatalf("handler ran %d times, want 0", n)
			}
		})
	}
}
