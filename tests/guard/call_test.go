package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestStoreCallReplay: a store given a call id (guard.WithCall) records it
// with the token it accepts. The same token with the same id again is a
// resend of that call: ErrReplayed (not ErrStale), and the work is not done
// again. Another caller's id with a stale token, or the same token with
// another id, is stale as before: one token, one accepted call. A call
// whose work failed is not replayed: SQLStore rolled it back (the resend
// applies it), MemoryStore spent the token (the resend is stale).
func TestStoreCallReplay(t *testing.T) {
	for name, s := range stateStores(t) {
		t.Run(name, func(t *testing.T) {
			const res = "call:payment:1001"
			applied := 0
			do := func(call string, token fence.Token, fail bool) error {
				c := ctx(t)
				if call != "" {
					c = guard.WithCall(c, call)
				}
				return s.store.Do(c, res, token, func(ctx context.Context) error {
					applied++
					if fail {
						return errors.New("the work failed")
					}
					r := httptest.NewRequest(http.MethodPost, "/", nil).WithContext(ctx)
					return s.write(r, int64(token))
				})
			}
			isStale := func(err error, last fence.Token) bool {
				var stale *guard.StaleError
				return errors.As(err, &stale) && stale.Last == last && !errors.Is(err, guard.ErrReplayed)
			}
			if err := do("call-a", 5, false); err != nil || applied != 1 {
				t.Fatalf("first call: %v, applied %d", err, applied)
			}
			err := do("call-a", 5, false)
			var replayed *guard.ReplayedError
			if !errors.As(err, &replayed) || errors.Is(err, guard.ErrStale) || replayed.Call != "call-a" || replayed.Token != 5 {
				t.Fatalf("the same call resent: %v; want a *ReplayedError, not stale", err)
			}
			if err := do("call-b", 5, false); !isStale(err, 5) {
				t.Fatalf("the same token with another call id: %v; want stale", err)
			}
			if err := do("call-a", 4, false); !isStale(err, 5) {
				t.Fatalf("another caller's call id with an older token (forged): %v; want stale", err)
			}
			if err := do("", 5, false); !isStale(err, 5) {
				t.Fatalf("the same token without a call id: %v; want stale", err)
			}
			if err := do("call a", 6, false); !errors.Is(err, guard.ErrInvalidCall) {
				t.Fatalf("an invalid call id: %v; want ErrInvalidCall", err)
			}
			if applied != 1 || s.read(t) != 5 {
				t.Fatalf("applied %d times, state %d; want once, 5", applied, s.read(t))
			}

			// A newer token without a call id: the call id recorded with 5
			// does not make a resend of 7 with it a replay.
			if err := do("", 7, false); err != nil {
				t.Fatal(err)
			}
			if err := do("call-a", 7, false); !isStale(err, 7) {
				t.Fatalf("call-a (recorded with 5) with token 7: %v; want stale", err)
			}

			if err := do("call-f", 8, true); err == nil {
				t.Fatal("failing work: nil error")
			}
			err = do("call-f", 8, false)
			if s.sql {
				if err != nil || s.read(t) != 8 {
					t.Fatalf("resend of a call rolled back: %v, state %d; want applied", err, s.read(t))
				}
			} else if !isStale(err, 8) {
				t.Fatalf("resend of a call whose work failed (token spent): %v; want stale, not replayed", err)
			}
		})
	}
}

// TestMiddlewareCallHeader: Middleware reads Fence-Call and answers a resend
// of an applied call 200 with Fence-Replayed, without running the handler;
// a forged id with a stale token gets 409; a malformed header 400.
func TestMiddlewareCallHeader(t *testing.T) {
	for name, s := range stateStores(t) {
		t.Run(name, func(t *testing.T) {
			applied := 0
			h := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				applied++
				if err := s.write(r, int64(applied)); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
				}
			}))
			send := func(token string, calls ...string) *httptest.ResponseRecorder {
				req := httptest.NewRequest(http.MethodPost, "/payments/1001", strings.NewReader("approve"))
				req.Header.Set(guard.TokenHeader, token)
				for _, c := range calls {
					req.Header.Add(guard.CallHeader, c)
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				return w
			}
			if w := send("5", "a1"); w.Code != http.StatusOK || w.Header().Get(guard.ReplayedHeader) != "" {
				t.Fatalf("first: %d %s", w.Code, w.Body)
			}
			if w := send("5", "a1"); w.Code != http.StatusOK || w.Header().Get(guard.ReplayedHeader) != "true" || !strings.Contains(w.Body.String(), guard.ProblemReplayed) {
				t.Fatalf("resend: %d %v %s; want 200 replayed", w.Code, w.Header(), w.Body)
			}
			if w := send("4", "a1"); w.Code != http.StatusConflict {
				t.Fatalf("forged call id with token 4: %d %s; want 409", w.Code, w.Body)
			}
			if w := send("5", "b2"); w.Code != http.StatusConflict {
				t.Fatalf("token 5 with another call id: %d %s; want 409", w.Code, w.Body)
			}
			for _, bad := range [][]string{{""}, {"a b"}, {strings.Repeat("x", 129)}, {"a1", "a1"}} {
				if w := send("6", bad...); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), guard.ProblemCall) {
					t.Fatalf("Fence-Call %q: %d %s; want 400 %s", bad, w.Code, w.Body, guard.ProblemCall)
				}
			}
			if applied != 1 || s.read(t) != 1 {
				t.Fatalf("handler ran %d times, state %d; want once", applied, s.read(t))
			}
		})
	}
}

// TestCreateTablesAddsCallColumn: a fence_tokens made before call ids
// (resource, token) keeps its rows when CreateTables adds call_id, again
// and again; before that, Fence with a call id fails with a message that
// names the fix, and Fence without one works as before.
func TestCreateTablesAddsCallColumn(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			if _, err := db.ExecContext(ctx(t), `CREATE TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL CHECK (token > 0))`); err != nil {
				t.Fatal(err)
			}
			if err := guard.Fence(ctx(t), db, "old", 5); err != nil {
				t.Fatal(err)
			}
			err := guard.Fence(guard.WithCall(ctx(t), "c1"), db, "old", 6)
			if err == nil || !strings.Contains(err.Error(), "CreateTables") {
				t.Fatalf("Fence with a call id on the old table: %v; want an error naming CreateTables", err)
			}
			for range 2 {
				if err := guard.CreateTables(ctx(t), db); err != nil {
					t.Fatal(err)
				}
			}
			if err := guard.Fence(ctx(t), db, "old", 5); !errors.Is(err, guard.ErrStale) {
				t.Fatalf("token 5 after the migration: %v; want stale (the row kept)", err)
			}
			if err := guard.Fence(guard.WithCall(ctx(t), "c1"), db, "old", 6); err != nil {
				t.Fatal(err)
			}
			if err := guard.Fence(guard.WithCall(ctx(t), "c1"), db, "old", 6); !errors.Is(err, guard.ErrReplayed) {
				t.Fatalf("resend: %v; want ErrReplayed", err)
			}
		})
	}
}

// TestRedisStoreCallReplay: redisstore records the caller's call id beside
// the accepted token: Gate answers an HTTP resend of an admitted request
// as admitted before (409, Fence-Replayed: admitted), without running the
// handler again; another id, or a stale
// token with a forged id, is refused; go-redis's own resend of one Accept
// (its reply lost) is still that Accept, accepted.
func TestRedisStoreCallReplay(t *testing.T) {
	prefix := "guardtest:call:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	d := redistest.NewDropper("{http:payment:1001}")
	client := redis.NewClient(&redis.Options{Addr: redisAddr, Dialer: d.Dial})
	t.Cleanup(func() { _ = client.Close() })
	s := redisstore.Store{Client: client, Prefix: prefix}
	if err := s.Accept(ctx(t), "warm", 1); err != nil { // load the script
		t.Fatal(err)
	}
	applied := 0
	h := guard.Gate(s, guard.HTTPOptions{Resource: oneResource})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { applied++ }))
	send := func(token, call string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/payments/1001", nil)
		req.Header.Set(guard.TokenHeader, token)
		req.Header.Set(guard.CallHeader, call)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	d.Arm() // the first admission's reply is lost, and go-redis resends its script
	if w := send("5", "a1"); w.Code != http.StatusOK || w.Header().Get(guard.ReplayedHeader) != "" {
		t.Fatalf("first, its reply lost once: %d %s", w.Code, w.Body)
	}
	if n := d.Dropped(); n != 1 {
		t.Fatalf("%d replies dropped; want 1", n)
	}
	// Gate spent the token at admission and does not know what the handler
	// did: the resend is answered "admitted before, outcome unknown" (409,
	// Fence-Replayed: admitted), not run again, and not 2xx.
	if w := send("5", "a1"); w.Code != http.StatusConflict || w.Header().Get(guard.ReplayedHeader) != "admitted" || !strings.Contains(w.Body.String(), guard.ProblemAdmitted) {
		t.Fatalf("resend: %d %v %s; want 409 admitted", w.Code, w.Header(), w.Body)
	}
	if w := send("4", "a1"); w.Code != http.StatusConflict {
		t.Fatalf("forged call id with token 4: %d %s; want 409", w.Code, w.Body)
	}
	if w := send("5", "b2"); w.Code != http.StatusConflict {
		t.Fatalf("token 5 with another call id: %d %s; want 409", w.Code, w.Body)
	}
	if applied != 1 {
		t.Fatalf("handler ran %d times; want once", applied)
	}
	var stale *guard.StaleError
	if err := s.Accept(ctx(t), "http:payment:1001", 5); !errors.As(err, &stale) || stale.Last != 5 {
		t.Fatalf("Accept(5) without a call id: %v; want stale", err)
	}
	if err := s.Accept(guard.WithCall(ctx(t), "a b"), "http:payment:1001", 6); !errors.Is(err, guard.ErrInvalidCall) {
		t.Fatalf("invalid call id: %v; want ErrInvalidCall", err)
	}
}

// TestCreateTablesMigratesAtOnce: services that start together each run
// CreateTables on a fence_tokens made before call ids, each on its own
// pool: every one succeeds (PostgreSQL: one at a time under the schema
// lock; SQLite: a process that lost the race to ALTER finds the column),
// and the rows stay.
func TestCreateTablesMigratesAtOnce(t *testing.T) {
	const workers = 8
	open := map[string]func(t *testing.T) func() (*sql.DB, error){
		"postgres": func(t *testing.T) func() (*sql.DB, error) {
			db := pg.NewDB(t)
			return func() (*sql.DB, error) { return db, nil }
		},
		"sqlite": func(t *testing.T) func() (*sql.DB, error) {
			path := filepath.Join(t.TempDir(), "shared.db")
			return func() (*sql.DB, error) { return sql.Open("sqlite", guard.SQLiteDSN(path)) }
		},
	}
	for name, opener := range open {
		t.Run(name, func(t *testing.T) {
			newDB := opener(t)
			db, err := newDB()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			for _, stmt := range []string{`CREATE TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL CHECK (token > 0))`,
				`INSERT INTO fence_tokens (resource, token) VALUES ('old', 5)`} {
				if _, err := db.ExecContext(ctx(t), stmt); err != nil {
					t.Fatal(err)
				}
			}
			errs := atOnce(workers, func(_ int, start <-chan struct{}) error {
				db, err := newDB()
				if err != nil {
					return err
				}
				if name == "sqlite" {
					defer db.Close()
				}
				<-start
				return guard.CreateTables(ctx(t), db)
			})
			for i, err := range errs {
				if err != nil {
					t.Errorf("process %d: %v", i, err)
				}
			}
			if err := guard.Fence(guard.WithCall(ctx(t), "c1"), db, "old", 5); !errors.Is(err, guard.ErrStale) {
				t.Fatalf("token 5 after the migration: %v; want stale (the row kept)", err)
			}
			if err := guard.Fence(guard.WithCall(ctx(t), "c1"), db, "old", 6); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStoreCallResendWhileFirstRuns: the resend arrives while the first
// copy's work is still under way (net/http resends as soon as the
// connection breaks; the server's first handler may not have returned).
// It waits for the first, and then is a replay if the first committed and
// is applied (once) if the first failed: never applied twice, never stale
// for a write that was made.
func TestStoreCallResendWhileFirstRuns(t *testing.T) {
	for name, s := range stateStores(t) {
		for _, firstFails := range []bool{false, true} {
			if firstFails && !s.sql {
				continue // MemoryStore spends a failed call's token: the resend is stale (TestStoreCallReplay)
			}
			t.Run(name+"/first-fails="+strconv.FormatBool(firstFails), func(t *testing.T) {
				res := "concurrent:" + strconv.FormatBool(firstFails)
				c := guard.WithCall(ctx(t), "same-call")
				var applied atomic.Int32
				entered, release := make(chan struct{}), make(chan struct{})
				first := make(chan error, 1)
				go func() {
					first <- s.store.Do(c, res, 5, func(ctx context.Context) error {
						applied.Add(1)
						close(entered)
						<-release
						if firstFails {
							return errors.New("the first copy's work failed")
						}
						return s.write(httptest.NewRequest(http.MethodPost, "/", nil).WithContext(ctx), 5)
					})
				}()
				<-entered
				second := make(chan error, 1)
				go func() {
					second <- s.store.Do(c, res, 5, func(ctx context.Context) error {
						applied.Add(1)
						return s.write(httptest.NewRequest(http.MethodPost, "/", nil).WithContext(ctx), 5)
					})
				}()
				if name == "sql-postgres" {
					waitLockWaiter(t, s)
				}
				close(release)
				err1, err2 := <-first, <-second
				t.Logf("first: %v; resend: %v; applied %d", err1, err2, applied.Load())
				if firstFails {
					if err1 == nil || err2 != nil || applied.Load() != 2 || s.read(t) != 5 {
						t.Fatalf("first %v, resend %v, work ran %d times, state %d; want the resend applied", err1, err2, applied.Load(), s.read(t))
					}
					return
				}
				if err1 != nil || !errors.Is(err2, guard.ErrReplayed) || applied.Load() != 1 {
					t.Fatalf("first %v, resend %v, work ran %d times; want nil, ErrReplayed, once", err1, err2, applied.Load())
				}
			})
		}
	}
}

// waitLockWaiter waits until a PostgreSQL session of the test's database
// waits for a lock (the resend, at the fence row the first copy holds).
func waitLockWaiter(t *testing.T, s stateStore) {
	t.Helper()
	db := s.store.(guard.SQLStore).DB
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the resend never waited for the first copy's lock")
		}
		time.Sleep(5 * time.Millisecond) // a short poll with a deadline
	}
}

// TestTransportCallerResend: a request on a new connection is not resent by
// net/http: its connection breaking after the commit gives the caller an
// error of unknown outcome. A caller that set Fence-Call itself, or an
// Idempotency-Key, and sends the request again under the same lease is
// told it was applied (a replay), and the write is not made twice.
// Transport keeps the caller's id (or derives it from the key), and
// refuses to send an invalid one.
func TestTransportCallerResend(t *testing.T) {
	for _, header := range []string{guard.CallHeader, "Idempotency-Key"} {
		for name, s := range stateStores(t) {
			callerResend(t, header, name, s)
		}
	}
}

func callerResend(t *testing.T, header, name string, s stateStore) {
	t.Run(header+"/"+name, func(t *testing.T) {
		var applied, served atomic.Int32
		fenced := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			applied.Add(1)
			if err := s.write(r, int64(applied.Load())); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		}))
		var gotCall atomic.Value
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			gotCall.Store(r.Header.Get(guard.CallHeader))
			if served.Add(1) > 1 {
				fenced.ServeHTTP(w, r)
				return
			}
			fenced.ServeHTTP(httptest.NewRecorder(), r) // committed; the answer is lost
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			_ = conn.Close()
		}))
		defer srv.Close()
		base := &http.Transport{}
		defer base.CloseIdleConnections()
		c := &http.Client{Transport: &guard.Transport{Base: base, Lease: memLease(t, "lock:payment:1001")}}
		send := func(call string) (*http.Response, error) {
			req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+"/payments/1001", strings.NewReader("approve"))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(header, call)
			return c.Do(req)
		}
		if resp, err := send("approve-1001-attempt"); err == nil {
			resp.Body.Close()
			t.Fatalf("the first copy's answer was lost, yet Do = %d", resp.StatusCode)
		}
		resp, err := send("approve-1001-attempt") // the caller's resend, same call id
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get(guard.ReplayedHeader) != "true" || header == guard.CallHeader && gotCall.Load() != "approve-1001-attempt" {
			t.Fatalf("the caller's resend: %d, Fence-Replayed %q, server saw Fence-Call %q; want 200 replayed, the caller's id", resp.StatusCode, resp.Header.Get(guard.ReplayedHeader), gotCall.Load())
		}
		if applied.Load() != 1 || s.read(t) != 1 {
			t.Fatalf("applied %d times (state %d); want once", applied.Load(), s.read(t))
		}
		if header != guard.CallHeader {
			return
		}
		before := served.Load()
		if _, err := send("not a call id"); !errors.Is(err, guard.ErrInvalidCall) || served.Load() != before {
			t.Fatalf("an invalid Fence-Call: %v, %d requests reached the server; want ErrInvalidCall, none", err, served.Load()-before)
		}
	})
}

// TestCreateTablesNotOwner: on PostgreSQL the service's role may use
// fence_tokens without owning it (a migration role made it). CreateTables,
// which such services ran at start-up, must not fail because the role may
// not add call_id: it leaves the table as it is; Fence without a call id
// works as before, and with one it fails with a message that says what to
// run.
func TestCreateTablesNotOwner(t *testing.T) {
	db := pg.NewDB(t)
	role := "guard_app_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, stmt := range []string{
		`CREATE TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL CHECK (token > 0))`,
		`CREATE TABLE fence_idempotency (key TEXT PRIMARY KEY)`,
		`CREATE ROLE ` + role,
		`GRANT ALL ON fence_tokens, fence_idempotency TO ` + role,
		`GRANT CREATE, USAGE ON SCHEMA public TO ` + role,
	} {
		if _, err := db.ExecContext(ctx(t), stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, stmt := range []string{`DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			if _, err := db.ExecContext(context.Background(), stmt); err != nil {
				t.Error(err)
			}
		}
	})
	conn, err := db.Conn(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx(t), `SET ROLE `+role); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.ExecContext(context.Background(), `RESET ROLE`) }()
	if err := guard.CreateTables(ctx(t), conn); err != nil {
		t.Fatalf("CreateTables as a role that does not own fence_tokens: %v; want nil, the table left as it is", err)
	}
	if err := guard.Fence(ctx(t), conn, "r", 5); err != nil {
		t.Fatalf("Fence without a call id: %v", err)
	}
	err = guard.Fence(guard.WithCall(ctx(t), "c1"), conn, "r", 6)
	if err == nil || !strings.Contains(err.Error(), "ADD COLUMN call_id") {
		t.Fatalf("Fence with a call id, no call_id column: %v; want an error that gives the ALTER TABLE", err)
	}
}

// TestSQLStoreWithoutCallColumn: a deployment whose fence_tokens was made
// before call ids and that does not run CreateTables at start-up, its
// clients upgraded to a Transport that sends Fence-Call. Its fenced
// requests must keep working as before (applied; a resend stale), not all
// fail with 503 until someone runs the migration.
func TestSQLStoreWithoutCallColumn(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			for _, stmt := range []string{`CREATE TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL CHECK (token > 0))`,
				`CREATE TABLE state (id INTEGER PRIMARY KEY, v BIGINT NOT NULL)`, `INSERT INTO state (id, v) VALUES (1, 0)`} {
				if _, err := db.ExecContext(ctx(t), stmt); err != nil {
					t.Fatal(err)
				}
			}
			applied := 0
			h := guard.Middleware(guard.SQLStore{DB: db}, guard.HTTPOptions{Resource: oneResource})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				applied++
				tx, _ := guard.TxFrom(r.Context())
				if _, err := tx.ExecContext(r.Context(), `UPDATE state SET v = v + 1 WHERE id = 1`); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
				}
			}))
			send := func(token string) int {
				req := httptest.NewRequest(http.MethodPost, "/payments/1001", nil)
				req.Header.Set(guard.TokenHeader, token)
				req.Header.Set(guard.CallHeader, "c1")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				return w.Code
			}
			if code := send("5"); code != http.StatusOK {
				t.Fatalf("a request with Fence-Call on a fence_tokens without call_id: %d; want 200, fenced as before", code)
			}
			if code := send("5"); code != http.StatusConflict {
				t.Fatalf("its resend: %d; want 409, as before call ids", code)
			}
			if code := send("4"); code != http.StatusConflict {
				t.Fatalf("an older token: %d; want 409", code)
			}
			var v int
			if err := db.QueryRowContext(ctx(t), `SELECT v FROM state WHERE id = 1`).Scan(&v); err != nil {
				t.Fatal(err)
			}
			if applied != 1 || v != 1 {
				t.Fatalf("handler ran %d times, state %d; want once", applied, v)
			}
		})
	}
}
