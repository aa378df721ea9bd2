package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/redis/go-redis/v9"
)

// TestGateReplayOfFailedHandler: Gate spends the token at admission, so an
// HTTP resend of an admitted call (same token, same Fence-Call) is answered
// without running the handler, whatever the first copy's handler did. Here
// it failed (the payment provider answered an error, or the process died
// between Accept and the handler): the resend must not be told 2xx, which a
// payment caller reads as "charged". Before the fix it got 200 with
// Fence-Replayed: true and "Already applied".
func TestGateReplayOfFailedHandler(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = client.Close() })
	s := redisstore.Store{Client: client, Prefix: "guardtest:gatefail:" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	ran := 0
	h := guard.Gate(s, guard.HTTPOptions{Resource: oneResource})(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		ran++
		if ran == 1 {
			http.Error(w, "payment provider unavailable", http.StatusBadGateway)
			return
		}
		_, _ = io.WriteString(w, "charged")
	}))
	send := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/payments/1001/charge", strings.NewReader("amount=100"))
		req.Header.Set(guard.TokenHeader, "5")
		req.Header.Set(guard.CallHeader, "charge-1001")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	if w := send(); w.Code != http.StatusBadGateway {
		t.Fatalf("first: %d %s; want the handler's 502", w.Code, w.Body)
	}
	w := send()
	t.Logf("resend: %d %v %s", w.Code, w.Header(), w.Body)
	if w.Code >= 200 && w.Code < 300 {
		t.Fatalf("resend of a call whose handler failed: %d, Fence-Replayed %q: a caller reads 2xx as done; nothing was charged",
			w.Code, w.Header().Get(guard.ReplayedHeader))
	}
	if w.Header().Get(guard.ReplayedHeader) == "true" || !strings.Contains(w.Body.String(), guard.ProblemAdmitted) {
		t.Fatalf("resend: Fence-Replayed %q, body %s; want not \"true\", type %s", w.Header().Get(guard.ReplayedHeader), w.Body, guard.ProblemAdmitted)
	}
	if ran != 1 {
		t.Fatalf("handler ran %d times; want once (the token was spent at admission)", ran)
	}
}

// TestMiddlewareCallOtherRequest: a careless caller reuses one Fence-Call
// (or one Idempotency-Key, from which Transport derives it) for two
// different requests under one lease. The second is not a resend of the
// first: it must not be answered 200 "already applied" without running.
// It is refused as any other call with that token is (409 stale); the same
// request again is still a replay. Before the fix the second got 200
// Fence-Replayed on every store, and the caller believed it applied.
func TestMiddlewareCallOtherRequest(t *testing.T) {
	for name, s := range stateStores(t) {
		t.Run(name, func(t *testing.T) {
			ran := 0
			h := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ran++
				if err := s.write(r, int64(ran)); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
				}
			}))
			send := func(method, target, body string) *httptest.ResponseRecorder {
				req := httptest.NewRequest(method, target, strings.NewReader(body))
				req.Header.Set(guard.TokenHeader, "5")
				req.Header.Set(guard.CallHeader, "idem-reused")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				return w
			}
			if w := send(http.MethodPost, "/payments/1001", "amount=100"); w.Code != http.StatusOK {
				t.Fatalf("first: %d %s", w.Code, w.Body)
			}
			for _, other := range []struct{ method, target, body string }{
				{http.MethodPost, "/payments/1001", "amount=900"},
				{http.MethodPost, "/payments/1001?refund=1", "amount=100"},
				{http.MethodDelete, "/payments/1001", "amount=100"},
			} {
				w := send(other.method, other.target, other.body)
				if w.Code != http.StatusConflict || w.Header().Get(guard.ReplayedHeader) != "" {
					t.Errorf("%s %s %q with the first request's call id: %d, Fence-Replayed %q; want 409, not a replay",
						other.method, other.target, other.body, w.Code, w.Header().Get(guard.ReplayedHeader))
				}
			}
			if w := send(http.MethodPost, "/payments/1001", "amount=100"); w.Code != http.StatusOK || w.Header().Get(guard.ReplayedHeader) != "true" {
				t.Fatalf("the first request resent: %d %v %s; want 200 replayed", w.Code, w.Header(), w.Body)
			}
			if ran != 1 || s.read(t) != 1 {
				t.Fatalf("handler ran %d times, state %d; want once", ran, s.read(t))
			}
		})
	}
}

// TestGateCallOtherRequest: the same with Gate, which reads no body: a
// request with another method or target under one Fence-Call is stale, not
// "admitted before".
func TestGateCallOtherRequest(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = client.Close() })
	s := redisstore.Store{Client: client, Prefix: "guardtest:gateother:" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	ran := 0
	h := guard.Gate(s, guard.HTTPOptions{Resource: oneResource})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ }))
	send := func(method, target string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, nil)
		req.Header.Set(guard.TokenHeader, "5")
		req.Header.Set(guard.CallHeader, "idem-reused")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	if w := send(http.MethodPost, "/payments/1001/capture"); w.Code != http.StatusOK {
		t.Fatalf("first: %d %s", w.Code, w.Body)
	}
	if w := send(http.MethodPost, "/payments/1001/refund"); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), guard.ProblemStale) {
		t.Fatalf("another target under the first call id: %d %s; want 409 %s", w.Code, w.Body, guard.ProblemStale)
	}
	if w := send(http.MethodPost, "/payments/1001/capture"); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), guard.ProblemAdmitted) {
		t.Fatalf("the first request resent: %d %s; want 409 %s", w.Code, w.Body, guard.ProblemAdmitted)
	}
	if ran != 1 {
		t.Fatalf("handler ran %d times; want once", ran)
	}
}

// TestMiddlewareFailedHandlerResend (held): a resend of a call whose
// handler failed is never told "replayed": MemoryStore spent the token and
// answers 409; SQLStore rolled back, and the resend runs the handler.
func TestMiddlewareFailedHandlerResend(t *testing.T) {
	for name, s := range stateStores(t) {
		t.Run(name, func(t *testing.T) {
			ran := 0
			h := guard.Middleware(s.store, guard.HTTPOptions{Resource: oneResource})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ran++
				if err := s.write(r, int64(ran)); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				if ran == 1 {
					http.Error(w, "provider down", http.StatusBadGateway)
				}
			}))
			send := func() *httptest.ResponseRecorder {
				req := httptest.NewRequest(http.MethodPost, "/payments/1001", strings.NewReader("amount=100"))
				req.Header.Set(guard.TokenHeader, "5")
				req.Header.Set(guard.CallHeader, "c-1")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				return w
			}
			if w := send(); w.Code != http.StatusBadGateway {
				t.Fatalf("first: %d", w.Code)
			}
			w := send()
			if w.Header().Get(guard.ReplayedHeader) != "" {
				t.Fatalf("resend after the handler failed: %d, Fence-Replayed %q", w.Code, w.Header().Get(guard.ReplayedHeader))
			}
			if s.sql {
				if w.Code != http.StatusOK || ran != 2 || s.read(t) != 2 {
					t.Fatalf("sql resend: %d, ran %d, state %d; want 200, the handler run again", w.Code, ran, s.read(t))
				}
			} else if w.Code != http.StatusConflict || ran != 1 {
				t.Fatalf("memory resend: %d, ran %d; want 409", w.Code, ran)
			}
		})
	}
}

// TestCallIDColonEncoding (held): SQL records "<token>:<call>", and a call
// id may hold ':'. Token 1 with call "5:abc" and token 15 with call "abc"
// would both read "15:abc" if split wrongly; every store compares the
// token and the whole id, so neither is taken for the other.
func TestCallIDColonEncoding(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = client.Close() })
	rs := redisstore.Store{Client: client, Prefix: "guardtest:colon:" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	accept := func(c context.Context, res string, token fence.Token) error {
		return rs.Accept(c, res, token)
	}
	stores := map[string]func(context.Context, string, fence.Token) error{"redis": accept}
	for name, s := range stateStores(t) {
		stores[name] = func(c context.Context, res string, token fence.Token) error {
			return s.store.Do(c, res, token, func(context.Context) error { return nil })
		}
	}
	for name, do := range stores {
		t.Run(name, func(t *testing.T) {
			if err := do(guard.WithCall(ctx(t), "abc"), "colon:a", 15); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				token fence.Token
				call  string
			}{{1, "5:abc"}, {15, "5:abc"}, {15, "15:abc"}, {15, ":abc"}, {15, "abc:"}, {15, "ABC"}} {
				if err := do(guard.WithCall(ctx(t), c.call), "colon:a", c.token); !errors.Is(err, guard.ErrStale) || errors.Is(err, guard.ErrReplayed) {
					t.Errorf("token %d call %q after 15 %q: %v; want stale", c.token, c.call, "abc", err)
				}
			}
			if err := do(guard.WithCall(ctx(t), "5:abc"), "colon:b", 1); err != nil {
				t.Fatal(err)
			}
			if err := do(guard.WithCall(ctx(t), "abc"), "colon:b", 15); err != nil {
				t.Fatalf("token 15 call abc after 1 5:abc: %v; want accepted", err)
			}
			if err := do(guard.WithCall(ctx(t), "5:abc"), "colon:b", 1); !errors.Is(err, guard.ErrStale) {
				t.Fatalf("token 1 call 5:abc after 15 abc: %v; want stale", err)
			}
		})
	}
}

// TestMiddlewareCallHeaderEdges (held): a 128-byte Fence-Call is a call id,
// a 129-byte or non-ASCII one is refused 400 before the store is asked; a
// Fence-Call sent as a trailer is not a call id (the request is fenced
// without one, so its resend is 409, never a replay on a trailer's say).
func TestMiddlewareCallHeaderEdges(t *testing.T) {
	store := &guard.MemoryStore{}
	ran := 0
	h := guard.Middleware(store, guard.HTTPOptions{Resource: oneResource})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran++ }))
	send := func(token, call string, trailer bool) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/payments/1001", strings.NewReader("x"))
		req.Header.Set(guard.TokenHeader, token)
		if trailer {
			req.Trailer = http.Header{guard.CallHeader: {call}}
		} else {
			req.Header.Set(guard.CallHeader, call)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	long := strings.Repeat("a", 128)
	if w := send("5", long, false); w.Code != http.StatusOK {
		t.Fatalf("128-byte call id: %d %s", w.Code, w.Body)
	}
	if w := send("5", long, false); w.Header().Get(guard.ReplayedHeader) != "true" {
		t.Fatalf("128-byte call id resent: %d %s; want a replay", w.Code, w.Body)
	}
	for _, bad := range []string{long + "a", "café", "a\tb", "a/b"} {
		if w := send("6", bad, false); w.Code != http.StatusBadRequest {
			t.Errorf("Fence-Call %q: %d; want 400", bad, w.Code)
		}
	}
	if w := send("7", "t-1", true); w.Code != http.StatusOK {
		t.Fatalf("trailer call: %d %s", w.Code, w.Body)
	}
	if w := send("7", "t-1", true); w.Code != http.StatusConflict {
		t.Fatalf("trailer call resent: %d %s; want 409 (a trailer is no call id)", w.Code, w.Body)
	}
	if ran != 2 {
		t.Fatalf("handler ran %d times; want 2", ran)
	}
}

// TestCreateTablesUnderLongFencedTx: a service starts (CreateTables) while
// another process has a fenced transaction open on a fence_tokens made
// before call ids (a handler calling a slow provider, or a session left
// idle in transaction). ALTER TABLE waits for that transaction's lock, and
// every fenced transaction that comes after queues behind the ALTER: all
// fenced traffic, on every resource, stalled for as long as the one
// transaction lasted, and the starting service hung in CreateTables.
// Before the fix a Fence on another resource ran into its 10 s deadline.
// CreateTables now waits at most a short lock_timeout for the ALTER, leaves
// the table as it is when it cannot get the lock (SQLStore then fences
// without call ids, as on a table it may not alter), and adds the column
// at a later run.
func TestCreateTablesUnderLongFencedTx(t *testing.T) {
	db := pg.NewDB(t)
	for _, stmt := range []string{
		`CREATE TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL CHECK (token > 0))`,
		`CREATE TABLE fence_idempotency (key TEXT PRIMARY KEY)`,
	} {
		if _, err := db.ExecContext(ctx(t), stmt); err != nil {
			t.Fatal(err)
		}
	}
	long, err := db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback() }()
	if err := guard.Fence(ctx(t), long, "slow-payment", 5); err != nil {
		t.Fatal(err)
	}
	created := make(chan error, 1)
	go func() { created <- guard.CreateTables(ctx(t), db) }()

	// Wait until the ALTER waits for the long transaction's lock (or
	// CreateTables has returned already).
	deadline := time.Now().Add(20 * time.Second)
	for waiting := false; !waiting; {
		var n int
		if err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%ALTER TABLE fence_tokens%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-created:
			created <- err
			waiting = true
		default:
			waiting = n > 0
		}
		if time.Now().After(deadline) {
			t.Fatal("CreateTables neither waited for the lock nor returned")
		}
		if !waiting {
			time.Sleep(5 * time.Millisecond) // a short poll with a deadline
		}
	}
	other, cancel := context.WithTimeout(ctx(t), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := guard.Tx(other, db, "other-payment", 7, func(*sql.Tx) error { return nil }); err != nil {
		t.Fatalf("a fenced transaction on another resource while the migration waits: %v after %v; want it through", err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("another resource's fenced transaction took %v while the long one was open", time.Since(start).Round(time.Millisecond))
	select {
	case err := <-created:
		if err != nil {
			t.Fatalf("CreateTables: %v; want nil, the table left as it is", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("CreateTables still waits for the long transaction")
	}
	if err := long.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	c := guard.WithCall(ctx(t), "c1")
	if err := guard.Tx(c, db, "other-payment", 8, func(*sql.Tx) error { return nil }); err != nil {
		t.Fatalf("after the later CreateTables, a call id: %v", err)
	}
	if err := guard.Tx(c, db, "other-payment", 8, func(*sql.Tx) error { return nil }); !errors.Is(err, guard.ErrReplayed) {
		t.Fatalf("resend after the migration: %v; want ErrReplayed", err)
	}
	var timeout string
	if err := db.QueryRowContext(ctx(t), `SHOW lock_timeout`).Scan(&timeout); err != nil || timeout != "0" {
		t.Fatalf("lock_timeout of a pooled session: %q %v; want 0, left as it was", timeout, err)
	}
}

// TestCreateTablesInCallerTxKeepsLockTimeout (held): CreateTables in the
// caller's transaction bounds its ALTER's wait with a local lock_timeout
// and sets the caller's own back: the rest of the caller's transaction
// waits for locks as it asked.
func TestCreateTablesInCallerTxKeepsLockTimeout(t *testing.T) {
	db := pg.NewDB(t)
	if _, err := db.ExecContext(ctx(t), `CREATE TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL CHECK (token > 0))`); err != nil {
		t.Fatal(err)
	}
	for _, set := range []string{"", "SET LOCAL lock_timeout = '7s'"} {
		tx, err := db.BeginTx(ctx(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		if set != "" {
			if _, err := tx.ExecContext(ctx(t), set); err != nil {
				t.Fatal(err)
			}
		}
		if err := guard.CreateTables(ctx(t), tx); err != nil {
			t.Fatal(err)
		}
		var timeout string
		if err := tx.QueryRowContext(ctx(t), `SHOW lock_timeout`).Scan(&timeout); err != nil {
			t.Fatal(err)
		}
		if want := map[string]string{"": "0"}[set]; set != "" && timeout != "7s" || set == "" && timeout != want {
			t.Fatalf("after CreateTables in a transaction (%q): lock_timeout %q", set, timeout)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRedisStoreCallRecordLost (held): redisstore keeps the caller's call
// id for ResendWindow in a key of its own. A resend after that key is gone
// (the window passed, an eviction, a DEL) is stale, never admitted twice;
// the token record itself has no expiry. Eight Accepts of one call at once
// (an HTTP resend racing go-redis's own) admit exactly one.
func TestRedisStoreCallRecordLost(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = client.Close() })
	prefix := "guardtest:calllost:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	s := redisstore.Store{Client: client, Prefix: prefix}
	c := guard.WithCall(ctx(t), "c-1")
	if err := s.Accept(c, "r", 5); err != nil {
		t.Fatal(err)
	}
	key := prefix + ":{r}"
	if ttl, err := client.PTTL(ctx(t), key+":call").Result(); err != nil || ttl <= 0 || ttl > redisstore.ResendWindow {
		t.Fatalf("call record's TTL %v %v; want within ResendWindow", ttl, err)
	}
	if ttl, err := client.PTTL(ctx(t), key).Result(); err != nil || ttl != -1 {
		t.Fatalf("token record's TTL %v %v; want none", ttl, err)
	}
	if err := s.Accept(c, "r", 5); !errors.Is(err, guard.ErrReplayed) {
		t.Fatalf("resend within the window: %v; want ErrReplayed", err)
	}
	if err := client.Del(ctx(t), key+":call").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Accept(c, "r", 5); !errors.Is(err, guard.ErrStale) || errors.Is(err, guard.ErrReplayed) {
		t.Fatalf("resend after the call record is gone: %v; want stale", err)
	}

	errs := make(chan error, 8)
	for range 8 {
		go func() { errs <- s.Accept(guard.WithCall(ctx(t), "c-2"), "r", 6) }()
	}
	admitted, replayed := 0, 0
	for range 8 {
		switch err := <-errs; {
		case err == nil:
			admitted++
		case errors.Is(err, guard.ErrReplayed):
			replayed++
		default:
			t.Errorf("concurrent Accept: %v", err)
		}
	}
	if admitted != 1 || replayed != 7 {
		t.Fatalf("8 Accepts of one call at once: %d admitted, %d replayed; want 1 and 7", admitted, replayed)
	}
}

// TestCallColumnOtherType: a fence_tokens whose call_id column a DBA added
// by hand with another type (BIGINT, UUID, VARCHAR(16)) cannot hold
// "<token>:<call>". CreateTables found the column and returned nil, and
// then every request from Transport (which always sends Fence-Call) failed
// 503 with "invalid input syntax for type bigint": an outage discovered
// only under traffic. CreateTables now refuses such a column at start-up
// with an error that names it and the fix.
func TestCallColumnOtherType(t *testing.T) {
	for _, typ := range []string{"BIGINT", "UUID", "VARCHAR(16)"} {
		t.Run(typ, func(t *testing.T) {
			db := pg.NewDB(t)
			if _, err := db.ExecContext(ctx(t), `CREATE TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL CHECK (token > 0), call_id `+typ+`)`); err != nil {
				t.Fatal(err)
			}
			err := guard.CreateTables(ctx(t), db)
			t.Logf("CreateTables: %v", err)
			if err == nil || !strings.Contains(err.Error(), "call_id") || !strings.Contains(strings.ToLower(err.Error()), "text") {
				err := guard.SQLStore{DB: db}.Do(guard.WithCall(ctx(t), "req-0123456789abcdef0123456789abcdef"), "r", 5, func(context.Context) error { return nil })
				t.Fatalf("CreateTables on a call_id %s: nil; then a request with a call id: %v", typ, err)
			}
		})
	}
}

// TestSQLStoreRerunOnlyBeforeFn: SQLStore runs a request's transaction again
// without the call id when Fence finds no call_id column, which happens
// before fn runs. But fn may fence another resource itself with the
// request's ctx (which carries the call id) on another database whose
// fence_tokens is older: that noCallColumnError came from inside fn, after
// its work, and SQLStore ran fn a second time (its calls to other systems
// made twice). Before the fix fn ran 2 times. Now only a failure before fn
// is rerun.
func TestSQLStoreRerunOnlyBeforeFn(t *testing.T) {
	dbs := databases(t)
	main, old := dbs["postgres"], dbs["sqlite"]
	if err := guard.CreateTables(ctx(t), main); err != nil {
		t.Fatal(err)
	}
	if _, err := old.ExecContext(ctx(t), `CREATE TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL CHECK (token > 0))`); err != nil {
		t.Fatal(err)
	}
	ran := 0
	err := guard.SQLStore{DB: main}.Do(guard.WithCall(ctx(t), "c-1"), "r", 5, func(c context.Context) error {
		ran++ // a call to a payment provider, say
		return guard.Fence(c, old, "ledger", 5)
	})
	if ran != 1 {
		t.Fatalf("fn ran %d times (error %v); want once", ran, err)
	}
	if err == nil || !strings.Contains(err.Error(), "CreateTables") {
		t.Fatalf("Do: %v; want fn's error, naming CreateTables", err)
	}
}

// TestStaleSameTokenDetail: a request refused because its token was already
// spent by another call (same token, another or no Fence-Call, or another
// request under the same one) was told "A newer fencing token was already
// accepted", which sends a caller looking for a lost lease; the answer now
// says that this token was used by another call (still 409, type stale,
// last_accepted_token equal to token).
func TestStaleSameTokenDetail(t *testing.T) {
	h := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{Resource: oneResource})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	send := func(token, call string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/payments/1001", strings.NewReader("x"))
		req.Header.Set(guard.TokenHeader, token)
		req.Header.Set(guard.CallHeader, call)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	if w := send("5", "a"); w.Code != http.StatusOK {
		t.Fatal(w.Code)
	}
	w := send("5", "b")
	if w.Code != http.StatusConflict || strings.Contains(w.Body.String(), "newer") || !strings.Contains(w.Body.String(), "another call") {
		t.Fatalf("token 5 again with another call: %d %s; want 409 saying the token was used by another call", w.Code, w.Body)
	}
	if w := send("4", "c"); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "newer") {
		t.Fatalf("token 4: %d %s; want 409 newer token", w.Code, w.Body)
	}
}

// TestCreateTablesSQLiteBusy: on SQLite (WAL, several processes) a service
// starting while another process's fenced transaction is open past the
// busy timeout: CREATE TABLE IF NOT EXISTS passes (it writes nothing), but
// CreateTables' ALTER for call_id failed with SQLITE_BUSY, and start-up
// failed where it passed before call ids. As on PostgreSQL, CreateTables now
// leaves the table as it is (SQLStore fences without call ids) and a later
// run adds the column.
func TestCreateTablesSQLiteBusy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "guard.db")
	open := func() *sql.DB {
		dsn := strings.Replace(guard.SQLiteDSN(path), "busy_timeout(10000)", "busy_timeout(300)", 1)
		db, err := sql.Open("sqlite", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	a, b := open(), open()
	for _, stmt := range []string{
		`CREATE TABLE fence_tokens (resource TEXT PRIMARY KEY, token BIGINT NOT NULL CHECK (token > 0))`,
		`CREATE TABLE fence_idempotency (key TEXT PRIMARY KEY)`,
	} {
		if _, err := a.ExecContext(ctx(t), stmt); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := a.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := guard.Fence(ctx(t), tx, "slow", 5); err != nil {
		t.Fatal(err)
	}
	if err := guard.CreateTables(ctx(t), b); err != nil {
		t.Fatalf("CreateTables while another process's fenced transaction is open: %v; want nil, the table left as it is", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := guard.CreateTables(ctx(t), b); err != nil {
		t.Fatal(err)
	}
	c := guard.WithCall(ctx(t), "c-1")
	if err := guard.Fence(c, b, "slow", 6); err != nil {
		t.Fatalf("after the later CreateTables: %v", err)
	}
	if err := guard.Fence(c, b, "slow", 6); !errors.Is(err, guard.ErrReplayed) {
		t.Fatalf("resend: %v; want ErrReplayed", err)
	}
}
