package payment_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/payment"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/pgtest"
	"github.com/fencekit/fence/internal/redistest"
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
	lite, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "p.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
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

// TestArticleStory: worker A reads the pending payment and pauses past its
// lease; B takes the lock, approves and charges; A wakes up and writes.
// Without fencing the payment is charged twice; with fencing A's write is
// rejected and B's stands.
func TestArticleStory(t *testing.T) {
	e := setup(t)
	for name, db := range e.dbs {
		for _, fenced := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fenced=%v", name, fenced), func(t *testing.T) {
				if _, err := db.ExecContext(ctx(t), `DELETE FROM charge; UPDATE payment SET status = 'PENDING', approved_by = NULL, last_fencing_token = 0`); err != nil {
					t.Fatal(err)
				}
				b := &payment.Service{Locker: e.locker, DB: db}
				var tokenB fence.Token
				a := &payment.Service{Locker: e.locker, DB: db, AfterRead: func(ctx context.Context, id int64, token fence.Token) {
					// A pauses: its lease runs out (the lock expires on Redis) and B goes ahead.
					if err := e.redis.PExpire(ctx, "fence:{"+payment.LockName(id)+"}", time.Millisecond).Err(); err != nil {
						t.Error(err)
					}
					var err error
					if tokenB, err = b.Approve(ctx, id, "B"); err != nil {
						t.Errorf("B's approval: %v", err)
					}
				}}
				approve := a.Approve
				if !fenced {
					approve = a.ApproveWithoutFencing
				}
				tokenA, errA := approve(ctx(t), 1001, "A")
				charges, err := payment.Charges(ctx(t), db, 1001)
				if err != nil {
					t.Fatal(err)
				}
				p, _ := payment.Get(ctx(t), db, 1001)
				if tokenB <= tokenA {
					t.Fatalf("B's token %d not greater than A's %d", tokenB, tokenA)
				}
				if !fenced {
					if len(charges) != 2 || p.ApprovedBy != "A" {
						t.Fatalf("without fencing: %d charges, approved by %s; the test did not show the hazard", len(charges), p.ApprovedBy)
					}
					return
				}
				if !errors.Is(errA, guard.ErrStale) {
					t.Fatalf("A's late write: %v, want ErrStale", errA)
				}
				if len(charges) != 1 || charges[0].By != "B" || p.ApprovedBy != "B" || p.Token != tokenB {
					t.Fatalf("with fencing: charges %+v, payment %+v; want only B's", charges, p)
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
