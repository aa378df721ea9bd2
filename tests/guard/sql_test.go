package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

var payments = guard.Table{Name: "payment", Key: "id", Column: "last_fencing_token"}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func setup(t *testing.T, db *sql.DB) {
	t.Helper()
	for _, stmt := range []string{
		`CREATE TABLE payment (id BIGINT PRIMARY KEY, status TEXT NOT NULL, approved_by TEXT,
			last_fencing_token BIGINT NOT NULL DEFAULT 0, version BIGINT NOT NULL DEFAULT 0)`,
		`INSERT INTO payment (id, status) VALUES (1001, 'PENDING')`,
		`CREATE TABLE accepted (seq BIGINT PRIMARY KEY, token BIGINT NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx(t), stmt); err != nil {
			t.Fatal(err)
		}
	}
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatal(err)
	}
}

func row(t *testing.T, db *sql.DB) (status string, by sql.NullString, token int64) {
	t.Helper()
	err := db.QueryRowContext(ctx(t), `SELECT status, approved_by, last_fencing_token FROM payment WHERE id = 1001`).Scan(&status, &by, &token)
	if err != nil {
		t.Fatal(err)
	}
	return status, by, token
}

func TestConditionalUpdate(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			approve := func(token fence.Token, by string) error {
				return payments.Update(ctx(t), db, 1001, token, "status = $3, approved_by = $4", "APPROVED", by)
			}
			if err := approve(5, "w5"); err != nil {
				t.Fatalf("token 5: %v", err)
			}
			var stale *guard.StaleError
			for _, tok := range []fence.Token{3, 5} {
				if err := approve(tok, "late"); !errors.As(err, &stale) || stale.Last != 5 || stale.Token != tok {
					t.Fatalf("token %d after 5: %v, want StaleError with last 5", tok, err)
				}
			}
			err := payments.Update(ctx(t), db, 9999, 7, "status = $3", "APPROVED")
			if !errors.Is(err, guard.ErrNoRow) || errors.Is(err, guard.ErrStale) {
				t.Fatalf("missing row: %v, want ErrNoRow", err)
			}
			for _, bad := range []fence.Token{0, -1} {
				if err := approve(bad, "bad"); !errors.Is(err, guard.ErrInvalidToken) {
					t.Fatalf("token %d: %v, want ErrInvalidToken", bad, err)
				}
			}
			bad := guard.Table{Name: "payment; DROP TABLE payment", Key: "id", Column: "last_fencing_token"}
			if err := bad.Update(ctx(t), db, 1001, 9, "status = $3", "X"); !errors.Is(err, guard.ErrInvalidTable) {
				t.Fatalf("injected table name: %v, want ErrInvalidTable", err)
			}
			if status, by, tok := row(t, db); status != "APPROVED" || by.String != "w5" || tok != 5 {
				t.Fatalf("row = %s by %s token %d, want APPROVED by w5 token 5", status, by.String, tok)
			}
		})
	}
}

func TestFencedTx(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			write := func(token fence.Token, by string) error {
				return guard.Tx(ctx(t), db, "payment:1001", token, func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx(t), `UPDATE payment SET status = 'APPROVED', approved_by = $1 WHERE id = 1001`, by)
					return err
				})
			}
			if err := write(10, "w10"); err != nil {
				t.Fatal(err)
			}
			if err := write(9, "w9"); !errors.Is(err, guard.ErrStale) {
				t.Fatalf("token 9 after 10: %v, want ErrStale", err)
			}
			boom := errors.New("boom")
			err := guard.Tx(ctx(t), db, "payment:1001", 11, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx(t), `UPDATE payment SET approved_by = 'w11' WHERE id = 1001`); err != nil {
					return err
				}
				return boom
			})
			if !errors.Is(err, boom) {
				t.Fatalf("fn error: %v", err)
			}
			if _, by, _ := row(t, db); by.String != "w10" {
				t.Fatalf("approved_by = %q, want w10: a stale or failed transaction wrote", by.String)
			}
			// The failed transaction rolled its token back too: 11 is still usable.
			if err := write(11, "w11"); err != nil {
				t.Fatalf("token 11 after a rolled-back 11: %v", err)
			}
			if err := guard.Tx(ctx(t), db, "payment:1001", -3, func(*sql.Tx) error { return nil }); !errors.Is(err, guard.ErrInvalidToken) {
				t.Fatalf("token -3: %v", err)
			}
			if err := guard.Fence(ctx(t), db, "bad{name}", 5); !errors.Is(err, guard.ErrInvalidResource) {
				t.Fatalf("bad resource: %v", err)
			}
		})
	}
}

// TestFencedTxConcurrent: 16 goroutines with interleaved tokens on one
// resource. Accepted tokens, in the order they committed, strictly
// increase; every rejected token was ≤ the token held at that moment.
func TestFencedTxConcurrent(t *testing.T) {
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			const workers, rounds = 16, 10
			var mu sync.Mutex
			var rejected []*guard.StaleError
			var wg sync.WaitGroup
			for g := range workers {
				wg.Go(func() {
					for r := range rounds {
						token := fence.Token(1 + g + r*workers)
						err := guard.Tx(ctx(t), db, "payment:1001", token, func(tx *sql.Tx) error {
							_, err := tx.ExecContext(ctx(t),
								`INSERT INTO accepted (seq, token) SELECT COALESCE(MAX(seq), 0) + 1, $1 FROM accepted`, int64(token))
							return err
						})
						var stale *guard.StaleError
						switch {
						case errors.As(err, &stale):
							mu.Lock()
							rejected = append(rejected, stale)
							mu.Unlock()
						case err != nil:
							t.Errorf("token %d: %v", token, err)
						}
					}
				})
			}
			wg.Wait()
			accepted := acceptedLog(t, db)
			if len(accepted)+len(rejected) != workers*rounds {
				t.Fatalf("%d accepted + %d rejected, want %d", len(accepted), len(rejected), workers*rounds)
			}
			if len(rejected) == 0 {
				t.Fatal("no token was rejected: the test did not exercise the guard")
			}
			for _, r := range rejected {
				if r.Token > r.Last || !accepted[int64(r.Last)] {
					t.Fatalf("rejected token %d against %d (accepted: %v)", r.Token, r.Last, accepted[int64(r.Last)])
				}
			}
			t.Logf("%d accepted, %d rejected", len(accepted), len(rejected))
		})
	}
}

// TestArticleStory is section 3 of the article on real Redis and each
// database: A gets a token and pauses; its lease expires; B gets a greater
// token and approves; A wakes up and its write is rejected.
func TestArticleStory(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer client.Close()
	locker, err := redislock.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			lock := "lock:payment:1001:" + name
			a, err := locker.Acquire(ctx(t), lock, fence.TTL(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			<-a.Done() // A is paused past its lease
			b, err := locker.Acquire(ctx(t), lock, fence.Wait(5*time.Second), fence.TTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Release(ctx(t))
			if err := payments.Update(ctx(t), db, 1001, b.Token(), "status = $3, approved_by = $4", "APPROVED", "B"); err != nil {
				t.Fatalf("B's approval: %v", err)
			}
			err = payments.Update(ctx(t), db, 1001, a.Token(), "status = $3, approved_by = $4", "APPROVED", "A")
			var stale *guard.StaleError
			if !errors.As(err, &stale) || stale.Last != b.Token() {
				t.Fatalf("A's late write: %v, want StaleError naming B's token %d", err, b.Token())
			}
			if status, by, tok := row(t, db); status != "APPROVED" || by.String != "B" || tok != int64(b.Token()) {
				t.Fatalf("row = %s by %s token %d, want B's write", status, by.String, tok)
			}
		})
	}
}

func TestOnceAndVersion(t *testing.T) {
	versions := guard.Table{Name: "payment", Key: "id", Column: "version"}
	for name, db := range databases(t) {
		t.Run(name, func(t *testing.T) {
			setup(t, db)
			if err := guard.Once(ctx(t), db, "approve:1001"); err != nil {
				t.Fatal(err)
			}
			if err := guard.Once(ctx(t), db, "approve:1001"); !errors.Is(err, guard.ErrDuplicate) {
				t.Fatalf("second Once = %v, want ErrDuplicate", err)
			}
			if err := guard.Once(ctx(t), db, ""); err == nil {
				t.Fatal("empty idempotency key accepted")
			}
			if err := versions.UpdateVersion(ctx(t), db, 1001, 0, "status = $3", "REVIEW"); err != nil {
				t.Fatal(err)
			}
			var conflict *guard.ConflictError
			if err := versions.UpdateVersion(ctx(t), db, 1001, 0, "status = $3", "LOST"); !errors.As(err, &conflict) || conflict.Current != 1 {
				t.Fatalf("stale version: %v, want ConflictError with current 1", err)
			}
			if err := versions.UpdateVersion(ctx(t), db, 4242, 0, "status = $3", "X"); !errors.Is(err, guard.ErrNoRow) {
				t.Fatalf("missing row: %v, want ErrNoRow", err)
			}
			if status, _, _ := row(t, db); status != "REVIEW" {
				t.Fatalf("status %q, want REVIEW", status)
			}
		})
	}
}
