package payment_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/payment"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/pgtest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/refused"
	"github.com/fencekit/fence/internal/testmain"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"
)

var pg *pgtest.Server

func TestMain(m *testing.M) {
	testmain.Run(m, func() (func(), error) {
		var err error
		pg, err = pgtest.Launch()
		if err != nil {
			return nil, err
		}
		return pg.Kill, nil
	})
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

type env struct {
	redis  *redis.Client
	locker *redislock.Locker
	dbs    map[string]*sql.DB
}

func setup(t *testing.T) env {
	srv := redistest.Start(t)
	c := srv.Client(t)
	l, err := redislock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	lite, err := sql.Open("sqlite", guard.SQLiteDSN(filepath.Join(t.TempDir(), "p.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lite.Close() })
	e := env{redis: c, locker: l, dbs: map[string]*sql.DB{"postgres": pg.NewDB(t), "sqlite": lite}}
	for _, db := range e.dbs {
		if err := payment.CreateSchema(ctx(t), db); err != nil {
			t.Fatal(err)
		}
		if err := payment.Insert(ctx(t), db, 1001, 5000); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func TestConcurrentApprovalsChargeOnce(t *testing.T) {
	e := setup(t)
	for name, db := range e.dbs {
		t.Run(name, func(t *testing.T) {
			svc := &payment.Service{Locker: e.locker, DB: db}
			var wg sync.WaitGroup
			results := make(chan error, 8)
			for i := range 8 {
				wg.Go(func() {
					_, err := svc.Approve(ctx(t), 1001, fmt.Sprintf("worker-%d", i))
					results <- err
				})
			}
			wg.Wait()
			close(results)
			ok := 0
			for err := range results {
				switch {
				case err == nil:
					ok++
				case !errors.Is(err, payment.ErrAlreadyApproved):
					t.Fatalf("approval: %v", err)
				}
			}
			charges, err := payment.Charges(ctx(t), db, 1001)
			if err != nil {
				t.Fatal(err)
			}
			if ok != 1 || len(charges) != 1 {
				t.Fatalf("%d approvals succeeded, %d charges; want 1 and 1", ok, len(charges))
			}
			if _, err := svc.Approve(ctx(t), 4242, "x"); !errors.Is(err, payment.ErrNotFound) {
				t.Fatalf("missing payment: %v", err)
			}
		})
	}
}

// serializableDB is a PostgreSQL database with payment 1001 pending whose
// transactions run at SERIALIZABLE.
func serializableDB(t *testing.T) *sql.DB {
	db := pg.NewDB(t)
	var name string
	if err := db.QueryRowContext(ctx(t), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx(t), `ALTER DATABASE `+name+` SET default_transaction_isolation = 'serializable'`); err != nil {
		t.Fatal(err)
	}
	db.SetMaxIdleConns(0) // drop the connection opened before the ALTER
	db.SetMaxIdleConns(2)
	if err := payment.CreateSchema(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	if err := payment.Insert(ctx(t), db, 1001, 5000); err != nil {
		t.Fatal(err)
	}
	return db
}

// approvals are the three ways to approve, by name.
var approvals = []struct {
	name    string
	approve func(*payment.Service) func(context.Context, int64, string) (fence.Token, error)
}{
	{"unfenced", func(s *payment.Service) func(context.Context, int64, string) (fence.Token, error) {
		return s.ApproveWithoutFencing
	}},
	{"token-only", func(s *payment.Service) func(context.Context, int64, string) (fence.Token, error) {
		return s.ApproveTokenOnly
	}},
	{"fenced", func(s *payment.Service) func(context.Context, int64, string) (fence.Token, error) { return s.Approve }},
}

func reset(t *testing.T, e env, db *sql.DB) {
	t.Helper()
	for _, stmt := range []string{`DELETE FROM charge`, `DELETE FROM fence_tokens`,
		`UPDATE payment SET status = 'PENDING', approved_by = NULL, last_fencing_token = 0`} {
		if _, err := db.ExecContext(ctx(t), stmt); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.redis.Del(ctx(t), lockKey).Err(); err != nil {
		t.Fatal(err)
	}
}

// lockKey is redislock's key for the lock of payment 1001; deleting it ends
// the holder's lease at once, as if it had run out.
var lockKey = "fence:{" + payment.LockName(1001) + "}"

// TestStaleWorkerWritesFirst is issue 10's hole 1: A reads PENDING and
// pauses; its lease runs out; B acquires and starts; A wakes up and writes
// FIRST, then B goes on. The article's token-only conditional update
// accepts both writes (A's token is above the row's, B's above A's): two
// charges. With the fenced read-modify-write B's read waits for A's
// transaction, sees APPROVED, and charges nothing.
//
// On a PostgreSQL database at SERIALIZABLE, B's fence may fail when A
// commits: B gets guard.ErrRetry, and charges nothing either.
func TestStaleWorkerWritesFirst(t *testing.T) {
	e := setup(t)
	dbs := map[string]*sql.DB{"postgres-serializable": serializableDB(t)}
	maps.Copy(dbs, e.dbs)
	for name, db := range dbs {
		for _, ap := range approvals {
			t.Run(name+"/"+ap.name, func(t *testing.T) {
				reset(t, e, db)
				bStarted, bRead, bGo := make(chan struct{}), make(chan struct{}), make(chan struct{})
				b := &payment.Service{Locker: e.locker, DB: db, Pause: func(_ context.Context, step payment.Step, _ int64, _ fence.Token) {
					switch step {
					case payment.Locked:
						close(bStarted)
					case payment.Read:
						close(bRead)
						<-bGo // B has read PENDING and waits until A has written
					}
				}}
				var errB error
				bDone := make(chan struct{})
				ctxB := ctx(t) // B is another request: A's contexts end when A returns
				a := &payment.Service{Locker: e.locker, DB: db, Pause: func(ctx context.Context, step payment.Step, _ int64, _ fence.Token) {
					if step != payment.Read {
						return
					}
					// A has read PENDING and pauses: its lease runs out, B acquires.
					if err := e.redis.Del(ctx, lockKey).Err(); err != nil {
						t.Error(err)
					}
					go func() { defer close(bDone); _, errB = ap.approve(b)(ctxB, 1001, "B") }()
					<-bStarted
					if ap.name != "fenced" {
						<-bRead // B reads PENDING too (with the fence, B's read waits for A's transaction)
					}
				}}
				_, errA := ap.approve(a)(ctx(t), 1001, "A")
				close(bGo)
				<-bDone
				if errA != nil && !errors.Is(errA, fence.ErrLeaseLost) {
					t.Fatalf("A: %v", errA)
				}
				charges, err := payment.Charges(ctx(t), db, 1001)
				if err != nil {
					t.Fatal(err)
				}
				if ap.name == "fenced" {
					// At SERIALIZABLE, B fails with ErrRetry if its fence was
					// waiting when A committed, and finds the payment approved
					// if it began after.
					okB := errors.Is(errB, payment.ErrAlreadyApproved) || name == "postgres-serializable" && errors.Is(errB, guard.ErrRetry)
					if len(charges) != 1 || charges[0].By != "A" || !okB {
						t.Fatalf("fenced: charges %+v, B: %v; want A's charge only and B finding it approved", charges, errB)
					}
					return
				}
				if len(charges) != 2 || errB != nil {
					t.Fatalf("%s: charges %+v, B: %v; want the double charge", ap.name, charges, errB)
				}
			})
		}
	}
}

// TestStaleWorkerWritesLast is the article's section 3: A pauses past its
// lease (after reading, or, fenced, before its transaction); B approves and
// charges; A wakes up and writes. Without fencing the payment is charged
// twice; with the token-only update or the fenced transaction A is rejected.
func TestStaleWorkerWritesLast(t *testing.T) {
	e := setup(t)
	for name, db := range e.dbs {
		for _, ap := range approvals {
			t.Run(name+"/"+ap.name, func(t *testing.T) {
				reset(t, e, db)
				pauseAt := payment.Read
				if ap.name == "fenced" {
					pauseAt = payment.Locked // a pause inside the fenced transaction would make B wait for A
				}
				b := &payment.Service{Locker: e.locker, DB: db}
				var tokenB fence.Token
				a := &payment.Service{Locker: e.locker, DB: db, Pause: func(ctx context.Context, step payment.Step, id int64, _ fence.Token) {
					if step != pauseAt {
						return
					}
					if err := e.redis.Del(ctx, lockKey).Err(); err != nil {
						t.Error(err)
					}
					var err error
					if tokenB, err = ap.approve(b)(ctx, id, "B"); err != nil {
						t.Errorf("B's approval: %v", err)
					}
				}}
				tokenA, errA := ap.approve(a)(ctx(t), 1001, "A")
				charges, err := payment.Charges(ctx(t), db, 1001)
				if err != nil {
					t.Fatal(err)
				}
				p, _ := payment.Get(ctx(t), db, 1001)
				if tokenB <= tokenA {
					t.Fatalf("B's token %d not greater than A's %d", tokenB, tokenA)
				}
				if ap.name == "unfenced" {
					if len(charges) != 2 || p.ApprovedBy != "A" {
						t.Fatalf("without fencing: %d charges, approved by %s; the test did not show the hazard", len(charges), p.ApprovedBy)
					}
					return
				}
				if !errors.Is(errA, guard.ErrStale) {
					t.Fatalf("A's late write: %v, want ErrStale", errA)
				}
				if len(charges) != 1 || charges[0].By != "B" || p.ApprovedBy != "B" || p.Token != tokenB {
					t.Fatalf("charges %+v, payment %+v; want only B's", charges, p)
				}
			})
		}
	}
}

func TestHandler(t *testing.T) {
	e := setup(t)
	svc := &payment.Service{Locker: e.locker, DB: e.dbs["postgres"]}
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	post := func(path, by string) int {
		req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+path, nil)
		if by != "" {
			req.Header.Set("X-Approver", by)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		path, by string
		want     int
	}{
		{"/payments/1001/approve", "", http.StatusBadRequest},
		{"/payments/abc/approve", "alice", http.StatusBadRequest},
		{"/payments/4242/approve", "alice", http.StatusNotFound},
		{"/payments/1001/approve", "alice", http.StatusOK},
		{"/payments/1001/approve", "bob", http.StatusConflict},
	} {
		if got := post(tc.path, tc.by); got != tc.want {
			t.Fatalf("POST %s by %q: %d, want %d", tc.path, tc.by, got, tc.want)
		}
	}
	resp, err := srv.Client().Get(srv.URL + "/payments/1001")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: %d", resp.StatusCode)
	}
}

// TestHandlerErrors (issue 10, hole 8): error bodies are generic. A held
// lock is 503 with Retry-After; a Redis outage is a logged 500, not "busy",
// and its address reaches the log only.
func TestHandlerErrors(t *testing.T) {
	e := setup(t)
	db := e.dbs["postgres"]
	var logged strings.Builder
	log := slog.New(slog.NewTextHandler(&logged, nil))
	call := func(svc *payment.Service, method, path string) (int, string, http.Header) {
		srv := httptest.NewServer(svc.Handler())
		defer srv.Close()
		req, _ := http.NewRequestWithContext(ctx(t), method, srv.URL+path, nil)
		req.Header.Set("X-Approver", "alice")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), resp.Header
	}

	held, err := e.locker.Acquire(ctx(t), payment.LockName(1001), fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	busy := &payment.Service{Locker: e.locker, DB: db, Log: log, LockOptions: []fence.Option{fence.Wait(0)}}
	code, body, h := call(busy, http.MethodPost, "/payments/1001/approve")
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || strings.Contains(body, "lock:") {
		t.Fatalf("lock held: %d %q Retry-After %q; want 503 with Retry-After and a generic body", code, body, h.Get("Retry-After"))
	}
	if err := held.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}

	deadAddr := refused.Addr(t) // Redis is down
	dead := redis.NewClient(&redis.Options{Addr: deadAddr, MaxRetries: -1})
	defer dead.Close()
	deadLocker, err := redislock.New(dead, &redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	down := &payment.Service{Locker: deadLocker, DB: db, Log: log}
	code, body, h = call(down, http.MethodPost, "/payments/1001/approve")
	if code != http.StatusInternalServerError || body != "internal error\n" || h.Get("Retry-After") != "" {
		t.Fatalf("Redis down: %d %q; want 500 \"internal error\"", code, body)
	}
	if !strings.Contains(logged.String(), deadAddr) {
		t.Fatalf("the log lacks the failure's detail: %s", logged.String())
	}

	closed := pg.NewDB(t)
	closed.Close()
	code, body, _ = call(&payment.Service{Locker: e.locker, DB: closed, Log: log}, http.MethodGet, "/payments/1001")
	if code != http.StatusInternalServerError || body != "internal error\n" {
		t.Fatalf("database closed: %d %q; want 500 \"internal error\"", code, body)
	}
	code, body, _ = call(busy, http.MethodGet, "/payments/4242")
	if code != http.StatusNotFound || strings.Contains(body, "4242") {
		t.Fatalf("missing payment: %d %q; want 404 with a generic body", code, body)
	}
}

// TestCommittedAfterLeaseLostSucceeds: A's lease runs out while its fenced
// transaction is open (after writing, before the commit), and no newer
// holder fences the payment meanwhile. The commit stands, since the fence
// accepted A's token, so Approve must report success with A's token: an
// error would tell the client (through Handler, a 500) that a payment it
// was charged for was not approved.
func TestCommittedAfterLeaseLostSucceeds(t *testing.T) {
	e := setup(t)
	for name, db := range e.dbs {
		t.Run(name, func(t *testing.T) {
			reset(t, e, db)
			var paused fence.Token
			a := &payment.Service{Locker: e.locker, DB: db, Pause: func(ctx context.Context, step payment.Step, _ int64, token fence.Token) {
				if step != payment.Written {
					return
				}
				paused = token
				if err := e.redis.Del(ctx, lockKey).Err(); err != nil { // the lease runs out
					t.Error(err)
				}
			}}
			token, err := a.Approve(ctx(t), 1001, "A")
			if err != nil || token != paused {
				t.Fatalf("Approve: token %d, %v; want token %d and no error (the approval committed)", token, err, paused)
			}
			charges, err := payment.Charges(ctx(t), db, 1001)
			if err != nil {
				t.Fatal(err)
			}
			if len(charges) != 1 || charges[0].By != "A" {
				t.Fatalf("charges %+v, want A's", charges)
			}
		})
	}
}

// TestHandlerRetryIs503: when the database gives up on the approval for a
// concurrent transaction (guard.ErrRetry: here SQLITE_BUSY on a database
// opened without a busy timeout, its write lock held by another
// transaction), Handler answers 503 with Retry-After and a generic body,
// not a 500: nothing was written, and the client may try again.
func TestHandlerRetryIs503(t *testing.T) {
	e := setup(t)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "nobusy.db")+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := payment.CreateSchema(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	if err := payment.Insert(ctx(t), db, 1001, 5000); err != nil {
		t.Fatal(err)
	}
	hold, err := db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if err := guard.Fence(ctx(t), hold, "other", 1); err != nil { // takes the write lock
		t.Fatal(err)
	}
	var logged strings.Builder
	svc := &payment.Service{Locker: e.locker, DB: db, Log: slog.New(slog.NewTextHandler(&logged, nil))}
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+"/payments/1001/approve", nil)
	req.Header.Set("X-Approver", "alice")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || strings.Contains(string(body), "SQLITE") {
		t.Fatalf("database conflict: %d %q Retry-After %q; want 503 with Retry-After and a generic body", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	if charges, err := payment.Charges(ctx(t), db, 1001); err != nil || len(charges) != 0 {
		t.Fatalf("charges %v (%v), want none", charges, err)
	}
}
