package pgtest

import (
	"context"
	"database/sql"
	"syscall"
	"testing"
	"time"
)

// CrashAfter makes what db holds durable (CHECKPOINT), runs do with the
// server's WAL writer stopped (SIGSTOP), then crashes the server (the WAL
// writer killed: the postmaster ends every backend and recovers from the
// WAL on disk), and returns once it answers on dsn again. A commit that do
// had acknowledged without flushing its WAL (synchronous_commit = off, the
// test server's setting) is lost; one flushed by its own backend is not.
// The server must be the test's own.
func CrashAfter(t testing.TB, db *sql.DB, dsn string, do func()) {
	t.Helper()
	if _, err := db.ExecContext(t.Context(), `CHECKPOINT`); err != nil {
		t.Fatal(err)
	}
	walwriter, err := walWriter(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(walwriter, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(walwriter, syscall.SIGCONT) })
	do()
	if err := syscall.Kill(walwriter, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitRecovered(t, dsn, walwriter)
}

// waitRecovered waits until the server answers on dsn again after the crash
// of its process old, which is gone: a new WAL writer runs once the
// recovery is over.
func waitRecovered(t testing.TB, dsn string, old int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			t.Fatalf("pgtest: the server did not recover: %v", ctx.Err())
		case <-retry.C:
		}
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := walWriter(ctx, db)
		_ = db.Close()
		if err == nil && pid != old {
			return
		}
		retry.Reset(20 * time.Millisecond)
	}
}

// walWriter returns the pid of the server's WAL writer.
func walWriter(ctx context.Context, db *sql.DB) (pid int, err error) {
	err = db.QueryRowContext(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'`).Scan(&pid)
	return pid, err
}
