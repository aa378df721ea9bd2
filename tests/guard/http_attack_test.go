package guard_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// The middleware tried as an attacker and a careless handler would.

// stateStores returns the Stores with a one-row state table for the SQL
// ones, and a way for a handler to write and the test to read the state.
type stateStore struct {
	store guard.Store
	write func(r *http.Request, v int64) error
	read  func(t *testing.T) int64
	sql   bool
}

func stateStores(t *testing.T) map[string]stateStore {
	var mem atomic.Int64
	all := map[string]stateStore{"memory": {
		store: &guard.MemoryStore{},
		write: func(_ *http.Request, v int64) error { mem.Store(v); return nil },
		read:  func(*testing.T) int64 { return mem.Load() },
	}}
	for name, db := range databases(t) {
		if err := guard.CreateTables(ctx(t), db); err != nil {
			t.Fatal(err)
		}
		for _, stmt := range []string{`CREATE TABLE state (id INTEGER PRIMARY KEY, v BIGINT NOT NULL)`, `INSERT INTO state (id, v) VALUES (1, 0)`} {
			if _, err := db.ExecContext(ctx(t), stmt); err != nil {
				t.Fatal(err)
			}
		}
		all["sql-"+name] = stateStore{
			store: guard.SQLStore{DB: db},
			write: func(r *http.Request, v int64) error {
				tx, ok := guard.TxFrom(r.Context())
				if !ok {
					return errors.New("no fenced transaction")
				}
				_, err := tx.ExecContext(r.Context(), `UPDATE state SET v = $1 WHERE id = 1`, v)
				return err
			},
			read: func(t *testing.T) int64 {
				var v int64
				if err := db.QueryRowContext(ctx(t), `SELECT v FROM state WHERE id = 1`).Scan(&v); err != nil {
					t.Fatal(err)
				}
				return v
			},
			sql: true,
		}
	}
	return all
}

// serveOnce runs h behind mw for one request with token and returns the
// recorder and the value h panicked with, if any.
func serveOnce(mw func(http.Handler) http.Handler, h http.HandlerFunc, token string) (w *httptest.ResponseRecorder, panicked any) {
	w = httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	req.Header.Set(guard.TokenHeader, token)
	defer func() { panicked = recover() }()
	mw(h).ServeHTTP(w, req)
	return w, nil
}

// A handler that writes, answers 200 and then panics: the panic reaches the
// server, nothing reached the client, and the SQL write is rolled back with
// its token unspent (on PostgreSQL the row lock is gone: the next request
// on the resource does not hang).
func TestHandlerPanicsInsideFencedTx(t *testing.T) {
	for name, s := range stateStores(t) {
		t.Run(name, func(t *testing.T) {
			mw := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource})
			boom := errors.New("boom")
			w, p := serveOnce(mw, func(w http.ResponseWriter, r *http.Request) {
				if err := s.write(r, 5); err != nil {
					t.Error(err)
				}
				_, _ = io.WriteString(w, "approved")
				panic(boom)
			}, "5")
			if p != boom {
				t.Fatalf("recovered %v, want the handler's panic", p)
			}
			if w.Body.Len() != 0 || len(w.Header()) != 0 {
				t.Fatalf("the client was sent %v %q before the rollback", w.Header(), w.Body)
			}
			if s.sql {
				if v := s.read(t); v != 0 {
					t.Fatalf("state %d after the panic, want 0 (rolled back)", v)
				}
			}
			retry := "5" // the rollback left the token unspent
			if !s.sql {
				retry = "6" // memory cannot undo writes, so the token was spent
			}
			w, p = serveOnce(mw, func(w http.ResponseWriter, r *http.Request) {
				if err := s.write(r, 6); err != nil {
					t.Error(err)
				}
			}, retry)
			if p != nil || w.Code != http.StatusOK {
				t.Fatalf("next request: %d %s, panic %v", w.Code, w.Body, p)
			}
			if v := s.read(t); v != 6 {
				t.Fatalf("state %d, want 6", v)
			}
		})
	}
}

// A handler that answers 404 is sent as written; with SQL its writes are
// rolled back and the token is not spent.
func TestHandlerFailureRollsBack(t *testing.T) {
	for name, s := range stateStores(t) {
		if !s.sql {
			continue
		}
		t.Run(name, func(t *testing.T) {
			mw := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource})
			w, _ := serveOnce(mw, func(w http.ResponseWriter, r *http.Request) {
				if err := s.write(r, 5); err != nil {
					t.Error(err)
				}
				w.Header().Set("X-Handler", "yes")
				http.Error(w, "no such payment", http.StatusNotFound)
			}, "5")
			if w.Code != http.StatusNotFound || w.Header().Get("X-Handler") != "yes" || !strings.Contains(w.Body.String(), "no such payment") {
				t.Fatalf("got %d %v %q, want the handler's 404", w.Code, w.Header(), w.Body)
			}
			if v := s.read(t); v != 0 {
				t.Fatalf("state %d after a 404, want 0", v)
			}
			if w, _ := serveOnce(mw, func(http.ResponseWriter, *http.Request) {}, "5"); w.Code != http.StatusOK {
				t.Fatalf("token 5 again after the rollback: %d, want 200", w.Code)
			}
		})
	}
}

// On PostgreSQL a failed statement aborts the transaction. A handler that
// ignores the error and answers 200 does not get its 200 through: the
// commit fails, the client gets 503, and nothing is written.
func TestHandlerWrites200ThenTxFails(t *testing.T) {
	s := stateStores(t)["sql-postgres"]
	mw := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource})
	w, _ := serveOnce(mw, func(w http.ResponseWriter, r *http.Request) {
		if err := s.write(r, 5); err != nil {
			t.Error(err)
		}
		tx, _ := guard.TxFrom(r.Context())
		_, _ = tx.ExecContext(r.Context(), `INSERT INTO no_such_table VALUES (1)`) // error ignored
		_, _ = io.WriteString(w, "approved")
	}, "5")
	if w.Code != http.StatusServiceUnavailable || strings.Contains(w.Body.String(), "approved") ||
		strings.Contains(w.Body.String(), "no_such_table") {
		t.Fatalf("got %d %q, want a generic 503", w.Code, w.Body)
	}
	if v := s.read(t); v != 0 {
		t.Fatalf("state %d, want 0", v)
	}
}

// Two requests with one token at once: one runs, the other is stale.
func TestSameTokenTwiceAtOnce(t *testing.T) {
	for name, s := range stateStores(t) {
		t.Run(name, func(t *testing.T) {
			entered := make(chan fence.Token, 2)
			in, release := make(chan struct{}), make(chan struct{})
			var served atomic.Int32
			mw := guard.Middleware(hookStore{s.store, func(tok fence.Token) { entered <- tok }}, guard.HTTPOptions{Resource: oneResource})
			srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if served.Add(1) == 1 {
					close(in)
					<-release
				}
				if err := s.write(r, int64(served.Load())); err != nil {
					t.Error(err)
				}
			})))
			defer srv.Close()
			codes := make(chan int, 2)
			for range 2 {
				go func() { code, _, _ := send(t, srv.Client(), srv.URL, guard.TokenHeader, "5"); codes <- code }()
			}
			<-in
			<-entered
			<-entered // both reached the store; the second waits for the first
			close(release)
			got := map[int]int{}
			for range 2 {
				got[<-codes]++
			}
			if got[http.StatusOK] != 1 || got[http.StatusConflict] != 1 || served.Load() != 1 || s.read(t) != 1 {
				t.Fatalf("statuses %v, handler ran %d times, state %d; want one 200, one 409, one run", got, served.Load(), s.read(t))
			}
		})
	}
}

// Forged and oversized headers are refused with a short body that does not
// echo them, and never reach the handler or the store.
func TestHostileHeaders(t *testing.T) {
	huge := strings.Repeat("9", 1<<20)
	for _, tc := range []struct {
		name    string
		headers []string
		problem string // the problem type of the answer
	}{
		{"huge token", []string{guard.TokenHeader, huge, guard.ResourceHeader, "payment:1"}, guard.ProblemInvalid},
		{"huge resource", []string{guard.TokenHeader, "5", guard.ResourceHeader, huge}, guard.ProblemResource},
		{"two tokens", []string{guard.TokenHeader, "5", guard.TokenHeader, "9", guard.ResourceHeader, "payment:1"}, guard.ProblemInvalid},
		{"two resources", []string{guard.TokenHeader, "5", guard.ResourceHeader, "a", guard.ResourceHeader, "b"}, guard.ProblemResource},
		{"no resource", []string{guard.TokenHeader, "5"}, guard.ProblemResource},
		{"token with a space", []string{guard.TokenHeader, "5 ", guard.ResourceHeader, "payment:1"}, guard.ProblemInvalid},
		{"control byte in resource", []string{guard.TokenHeader, "5", guard.ResourceHeader, "pay\x00ment"}, guard.ProblemResource},
		{"forged maximum", []string{guard.TokenHeader, "9223372036854775807", guard.ResourceHeader, "payment:1"}, guard.ProblemInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := hookStore{&guard.MemoryStore{}, func(fence.Token) { t.Error("the store was asked") }}
			mw := guard.Middleware(store, guard.HTTPOptions{Resource: guard.ResourceFromHeader})
			w := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodPost, "/", nil)
			for i := 0; i < len(tc.headers); i += 2 {
				req.Header.Add(tc.headers[i], tc.headers[i+1])
			}
			mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("handler ran") })).ServeHTTP(w, req)
			if w.Code != http.StatusBadRequest || w.Body.Len() > 512 || strings.Contains(w.Body.String(), "9999999999999999999999") {
				t.Fatalf("got %d, %d bytes: %.200s", w.Code, w.Body.Len(), w.Body)
			}
			// Refused for the reason the case is about, not for another
			// header the case forgot.
			var p guard.Problem
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Type != tc.problem {
				t.Fatalf("problem %q (%v), want %q: %s", p.Type, err, tc.problem, w.Body)
			}
		})
	}
}

// A handler cannot flush its answer to the client before the commit.
func TestHandlerCannotFlushEarly(t *testing.T) {
	mw := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{Resource: oneResource})
	w, _ := serveOnce(mw, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "partial")
		if err := http.NewResponseController(w).Flush(); !errors.Is(err, http.ErrNotSupported) {
			t.Errorf("Flush: %v, want ErrNotSupported", err)
		}
		if _, _, err := http.NewResponseController(w).Hijack(); !errors.Is(err, http.ErrNotSupported) {
			t.Errorf("Hijack: %v, want ErrNotSupported", err)
		}
	}, "5")
	if w.Flushed || w.Body.String() != "partial" {
		t.Fatalf("flushed %v, body %q", w.Flushed, w.Body)
	}
}

// A request whose client gave up while it waited for the resource does not
// run its handler later: MemoryStore stops waiting when the context ends.
func TestCancelledWhileWaiting(t *testing.T) {
	store := &guard.MemoryStore{}
	mw := guard.Middleware(store, guard.HTTPOptions{Resource: oneResource})
	in, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		serveOnce(mw, func(http.ResponseWriter, *http.Request) { close(in); <-release }, "5")
	}()
	<-in
	cctx, cancel := context.WithCancel(ctx(t))
	cancel()
	w := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(cctx, http.MethodPost, "/", nil)
	req.Header.Set(guard.TokenHeader, "7")
	mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("handler ran") })).ServeHTTP(w, req)
	close(release)
	<-done
	if w.Code != http.StatusServiceUnavailable || strings.Contains(w.Body.String(), "canceled") {
		t.Fatalf("got %d %s, want a generic 503", w.Code, w.Body)
	}
	if w, _ := serveOnce(mw, func(http.ResponseWriter, *http.Request) {}, "7"); w.Code != http.StatusOK {
		t.Fatalf("token 7 after its cancelled attempt: %d, want 200 (not spent)", w.Code)
	}
}

// A handler that sends an informational answer first (103 Early Hints)
// and then 200: the 103 is dropped (it would reach the client before the
// commit), and the 200 commits the handler's write.
func TestInformationalAnswerThen200Commits(t *testing.T) {
	for name, s := range stateStores(t) {
		t.Run(name, func(t *testing.T) {
			mw := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource})
			w, _ := serveOnce(mw, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Link", "</style.css>; rel=preload")
				w.WriteHeader(http.StatusEarlyHints)
				if err := s.write(r, 5); err != nil {
					t.Error(err)
				}
				w.WriteHeader(http.StatusOK)
				_, _ = io.WriteString(w, "approved")
			}, "5")
			if w.Code != http.StatusOK || w.Body.String() != "approved" {
				t.Fatalf("got %d %q, want 200 approved", w.Code, w.Body)
			}
			if v := s.read(t); v != 5 {
				t.Fatalf("state %d, want 5 (committed)", v)
			}
		})
	}
}

// joinStore runs fn through a MemoryStore and adds an error of its own to
// what fn returned, as SQLStore does when the rollback after a failed
// handler fails too.
type joinStore struct{ guard.MemoryStore }

var errCleanup = errors.New("cleanup failed")

func (s *joinStore) Do(ctx context.Context, resource string, token fence.Token, fn func(context.Context) error) error {
	return errors.Join(s.MemoryStore.Do(ctx, resource, token, fn), errCleanup)
}

// When the handler fails (a non-2xx answer, or a panic) and the store adds
// a failure of its own, the handler's answer or panic goes on, and the
// store's failure is logged at level Error.
func TestStoreFailureAfterHandlerFailureIsLogged(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
	}{
		{"non-2xx", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", http.StatusTeapot) }},
		{"panic", func(http.ResponseWriter, *http.Request) { panic("boom") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logged strings.Builder
			log := slog.New(slog.NewTextHandler(&logged, nil))
			mw := guard.Middleware(&joinStore{}, guard.HTTPOptions{Resource: oneResource, Logger: log})
			w, panicked := serveOnce(mw, tc.handler, "5")
			if tc.name == "panic" && panicked != "boom" || tc.name != "panic" && w.Code != http.StatusTeapot {
				t.Fatalf("got %d, panic %v; want the handler's answer or panic", w.Code, panicked)
			}
			if !strings.Contains(logged.String(), "level=ERROR") || !strings.Contains(logged.String(), errCleanup.Error()) {
				t.Fatalf("the store's own failure was not logged: %q", logged.String())
			}
		})
	}
}
