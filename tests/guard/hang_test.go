package guard_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/guard/redisstore"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/stopped"
)

// TestRedisStoreHungServerWithinDeadline pauses the Redis server behind a
// redisstore.Store (SIGSTOP) and asks it to accept a token with a context
// that ends after 200 ms, on a client with go-redis's default options
// (ContextTimeoutEnabled off, ReadTimeout 3 s). Accept must return by the
// context's end, with its error, as redislock's calls do: a gate in front of
// a request must not hold it for the client's socket timeout, nor for ever
// when the client sets none. The same for a cancellation without deadline,
// and the same with ClockTokens and Replicas (the script pipelined with
// WAIT).
func TestRedisStoreHungServerWithinDeadline(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		srv := redistest.Start(t)
		hungStore(t, srv, redisstore.Store{Client: srv.Client(t)})
	})
	t.Run("ClockTokens-Replicas", func(t *testing.T) {
		srv := redistest.Start(t)
		hungStore(t, srv, redisstore.Store{Client: srv.Client(t), ClockTokens: true, Replicas: 1, ReplicaTimeout: 100 * time.Millisecond})
	})
}

func hungStore(t *testing.T, srv *redistest.Server, store redisstore.Store) {
	// A pooled connection, warm; with ClockTokens the fresh store's floor
	// refuses token 1, and with Replicas and no replica it is not
	// confirmed.
	if err := store.Accept(ctx(t), "hung", 1); err != nil && !errors.Is(err, guard.ErrStoreLost) && !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatal(err)
	}
	resume := srv.Pause(t)
	defer resume()

	const wait = 200 * time.Millisecond
	const slack = 800 * time.Millisecond
	check := func(name string, c context.Context, want error) {
		t.Helper()
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- store.Accept(c, "hung", 2) }()
		timer := time.NewTimer(wait + slack)
		defer timer.Stop()
		select {
		case err := <-done:
			took := time.Since(start)
			if took > wait+slack || !errors.Is(err, want) || errors.Is(err, guard.ErrStale) {
				t.Errorf("%s: Accept on a hung server returned %v after %v; want %v within %v", name, err, took, want, wait+slack)
			}
		case <-timer.C:
			t.Errorf("%s: Accept on a hung server still running after %v (context ended after %v)", name, wait+slack, wait)
			<-done
		}
	}

	dctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	check("deadline", dctx, context.DeadlineExceeded)

	cctx, cancelNow := context.WithCancel(context.Background())
	stop := time.AfterFunc(wait, cancelNow)
	defer stop.Stop()
	check("cancel", cctx, context.Canceled)
}

// TestTxHungPostgresWithinDeadline stops (SIGSTOP) the PostgreSQL backend of
// a fenced transaction after its fence, and has fn write through it with
// Tx's context, which ends after 200 ms. Tx must return by then with the
// context's error, and once the backend resumes and finds its client gone,
// the token must not be recorded (nor the write made): the transaction
// never committed. A newer token is then accepted.
func TestTxHungPostgresWithinDeadline(t *testing.T) {
	db, proc, resume := oneBackend(t)

	const wait = 200 * time.Millisecond
	const slack = 800 * time.Millisecond
	tctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		done <- guard.Tx(tctx, db, "payment:1001", 5, func(tx *sql.Tx) error {
			if err := proc.Signal(syscall.SIGSTOP); err != nil {
				return err
			}
			stopped.Wait(proc.Pid, stopped.Limit)
			_, err := tx.ExecContext(tctx, `UPDATE payment SET approved_by = 'hung' WHERE id = 1001`)
			return err
		})
	}()
	timer := time.NewTimer(wait + slack)
	defer timer.Stop()
	select {
	case err := <-done:
		if took := time.Since(start); took > wait+slack || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Tx on a hung backend returned %v after %v; want the deadline's error within %v", err, took, wait+slack)
		}
	case <-timer.C:
		t.Errorf("Tx on a hung backend still running after %v (context ended after %v)", wait+slack, wait)
		resume()
		<-done
	}
	resume()
	// The resumed backend finds its client gone and rolls back; its row
	// lock then goes, and token 6 is accepted.
	next, cancelNext := context.WithTimeout(ctx(t), 10*time.Second)
	defer cancelNext()
	if err := approveTx(next, db, 6, "w6"); err != nil {
		t.Fatalf("token 6 after the hung transaction: %v", err)
	}
	last := lastToken(t, db, "payment:1001")
	if _, by, _ := row(t, db); last != 6 || by.String != "w6" {
		t.Fatalf("after the hung transaction and token 6: last token %d, approved_by %q; want 6 and w6", last, by.String)
	}
}

// TestRedisStoreForgetsAfterRestart: redisstore.Store keeps the last
// accepted token of a resource in a key without persistence of its own. A
// Redis restarted without persistence comes back without it. The default
// Store then accepts the next token whatever it is: a stale holder that was
// rejected before the restart is accepted after it (the "default" case
// shows it still does, as documented). With ClockTokens the floor is lost
// with the records and made again at the restart, above every token issued
// before it: the stale token is refused with ErrStoreLost, and a holder
// that acquires again is accepted.
func TestRedisStoreForgetsAfterRestart(t *testing.T) {
	t.Run("ClockTokens", func(t *testing.T) {
		srv := redistest.Start(t)
		c := srv.Client(t)
		store := clockStore(c)
		t5 := primeFloor(t, store, c)
		acceptThenStale(t, store, t5, t5+2)
		srv.Restart(t)
		if err := store.Accept(ctx(t), "payment:1001", t5); !errors.Is(err, guard.ErrStoreLost) {
			t.Fatalf("token %d after %d and a Redis restart: %v, want ErrStoreLost", t5, t5+2, err)
		}
		if err := store.Accept(ctx(t), "payment:1001", serverMicros(t, c)+1); err != nil {
			t.Fatalf("a token issued after the restart: %v, want it accepted", err)
		}
	})
	t.Run("default", func(t *testing.T) {
		srv := redistest.Start(t)
		store := redisstore.Store{Client: srv.Client(t)}
		acceptThenStale(t, store, 5, 7)
		srv.Restart(t)
		if err := store.Accept(ctx(t), "payment:1001", 5); err != nil {
			t.Fatalf("default Store, token 5 after 7 and a Redis restart: %v; the documented behaviour is that it is accepted (set ClockTokens)", err)
		}
	})
}

// TestTxCommitInDoubtIsNotRetry stops the backend just before Tx commits
// and resumes it after Tx's deadline: the backend then reads the COMMIT
// waiting in its socket and commits. Tx's error must therefore not match
// ErrRetry, which promises that nothing was written; it carries the
// deadline's error, and the outcome is unknown (see Tx's doc).
func TestTxCommitInDoubtIsNotRetry(t *testing.T) {
	db, proc, resume := oneBackend(t)
	tctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := guard.Tx(tctx, db, "payment:1001", 5, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(tctx, `UPDATE payment SET approved_by = 'w5' WHERE id = 1001`); err != nil {
			return err
		}
		if err := proc.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		stopped.Wait(proc.Pid, stopped.Limit)
		return nil
	})
	resume()
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, guard.ErrRetry) {
		t.Fatalf("Tx whose commit outlived its deadline: %v; want the deadline's error, not ErrRetry", err)
	}
	_, by, _ := row(t, db)
	t.Logf("Tx returned %v; after the backend resumed, approved_by = %q (committed: %v)", err, by.String, by.String == "w5")
}

// oneBackend is a database of one connection, set up, with its PostgreSQL
// backend's process (to stop it with SIGSTOP) and resume, which sends it
// SIGCONT once (at the test's end too).
func oneBackend(t *testing.T) (*sql.DB, *os.Process, func()) {
	db := pg.NewDB(t)
	db.SetMaxOpenConns(1) // the transactions run on the backend whose pid is read
	setup(t, db)
	var pid int
	if err := db.QueryRowContext(ctx(t), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	proc, err := os.FindProcess(pid)
	if err != nil {
		t.Fatal(err)
	}
	var resumeOnce sync.Once
	resume := func() { resumeOnce.Do(func() { _ = proc.Signal(syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return db, proc, resume
}
