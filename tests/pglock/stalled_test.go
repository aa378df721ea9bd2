package pglock_test

import (
	"context"
	"database/sql"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// An Acquire whose try went into the socket of a backend that is stalled
// (here stopped with SIGSTOP: a server paging, a VM paused) fails by its
// ctx, and gives up. pgx then sends a CancelRequest, which the stalled
// backend will find as it resumes, idle, and ignore; the give-up's
// owner-checked clean-up runs on another connection, finds nothing to free,
// and the backend, once resumed, reads the try and commits it: the lock
// was held for its whole TTL (a minute) by the owner of an Acquire that had
// returned an error. The clean-up must make sure the abandoned statement
// can never run: the lock must be free once the backend has resumed and is
// gone, whether it resumed while the clean-up waited for it (resumeDuring)
// or only after the clean-up had given up waiting (resumeAfter).
func TestGivenUpTryOnStalledBackend(t *testing.T) {
	t.Run("resumeDuring", func(t *testing.T) { testStalledBackend(t, false) })
	t.Run("resumeAfter", func(t *testing.T) { testStalledBackend(t, true) })
}

func testStalledBackend(t *testing.T, after bool) {
	const name = "stalled-backend"
	d := newDatabase(t, pg)
	db := open(t, d.dsn, nil)
	db.SetMaxOpenConns(1) // the try goes to the backend whose PID we read
	l := d.locker(t, db)
	// The row exists, free: the try is the UPDATE that takes it.
	first, err := l.Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := db.QueryRowContext(ctxFor(t, 10*time.Second), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("stop backend %d: %v", pid, err)
	}
	stopped := true
	resume := func() {
		if stopped {
			stopped = false
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("resume backend %d: %v", pid, err)
			}
		}
	}
	t.Cleanup(resume)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := l.Acquire(ctx, name, fence.TTL(time.Minute)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire on a stalled backend = %v, want its ctx's deadline", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Acquire with a 300 ms ctx on a stalled backend returned after %v", took)
	}

	// The clean-up, if it waits for the stalled backend to go, shows as a
	// session waiting for BackendTermination. Without that wait (the fix
	// missing) the clean-up has run by then, or never comes.
	terminating := func() bool {
		var n int
		err := d.db.QueryRowContext(ctxFor(t, 5*time.Second),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'BackendTermination'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	seen := pollFor(3*time.Second, terminating)
	t.Logf("clean-up waiting for the stalled backend: %v", seen)
	if after && seen {
		// Let the clean-up give up waiting (the backend stays stopped).
		if !pollFor(5*time.Second, func() bool { return !terminating() }) {
			t.Fatal("the clean-up still waits for the stalled backend 5 s on")
		}
	}
	resume()
	// The resumed backend runs what is in its socket, or dies: wait until
	// it is gone (the client closed its connection).
	gone := pollFor(10*time.Second, func() bool {
		var n int
		err := d.db.QueryRowContext(ctxFor(t, 5*time.Second),
			`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	if !gone {
		t.Fatalf("backend %d still there 10 s after it resumed", pid)
	}
	var owner string
	var token int64
	var left sql.NullFloat64
	if err := d.db.QueryRowContext(ctxFor(t, 5*time.Second),
		`SELECT owner, token, extract(epoch FROM expires_at - clock_timestamp()) FROM fence_leases WHERE name = $1`,
		name).Scan(&owner, &token, &left); err != nil {
		t.Fatal(err)
	}
	// The free that follows the wait may have undone the try, had it
	// run: its token would show it.
	if token != int64(first.Token()) {
		t.Errorf("the abandoned try ran: the row's token is %d, owner %q, %.1f s left; the last lease's token was %d",
			token, owner, left.Float64, first.Token())
	}
	lease, err := d.locker(t, d.db).Acquire(ctxFor(t, 10*time.Second), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("the lock is held after the Acquire that gave up (owner %q, %.1f s left): %v", owner, left.Float64, err)
	}
	_ = lease.Release(ctxFor(t, 10*time.Second))
}

// pollFor polls cond until it holds or d has passed, and reports whether
// it held.
func pollFor(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	return true
}
