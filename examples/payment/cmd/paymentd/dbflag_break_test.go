package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redistest"
)

// TestSQLiteFileNamedPostgres: -db takes "a postgres:// URL, or the path of
// a SQLite file". A SQLite file whose name starts with "postgres"
// (postgres-payments.db) is a file. Before, any -db starting with
// "postgres" went to the PostgreSQL driver, which failed to parse the
// path, and paymentd did not start.
func TestSQLiteFileNamedPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs := redistest.Start(t)
	t.Chdir(t.TempDir()) // -db postgres-payments.db, as a user types it
	for _, name := range []string{"postgres-payments.db", "postgresql.db"} {
		t.Run(name, func(t *testing.T) {
			path := name
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			cfg := config{redis: secret("redis://" + rs.Addr), db: secret(path), listen: "127.0.0.1:0", seed: 1001,
				listening: func(string) { stop() }}
			if err := run(runCtx, cfg); err != nil {
				t.Fatalf("-db %s: %v", path, err)
			}
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("-db %s: no SQLite file: %v", path, err)
			}
		})
	}
}

// TestSQLiteInMemoryRefused: -db :memory: (or a file: DSN with
// mode=memory and no shared cache) gives each pooled connection a database
// of its own, empty: the schema and the seed exist on one connection, and
// approvals served on another failed with "no such table" (500s, at random,
// once two requests overlapped). paymentd must refuse it at start with a
// clear error. Before, it started and served.
func TestSQLiteInMemoryRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs := redistest.Start(t)
	for _, db := range []string{":memory:", "file::memory:", "file:p.db?mode=memory"} {
		t.Run(db, func(t *testing.T) {
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			cfg := config{redis: secret("redis://" + rs.Addr), db: secret(db), listen: "127.0.0.1:0", seed: 1001,
				listening: func(string) { stop() }}
			if err := run(runCtx, cfg); err == nil || !strings.Contains(err.Error(), "memory") {
				t.Fatalf("-db %s: %v; want an error saying why an in-memory database does not serve", db, err)
			}
		})
	}
}

// TestListenPortBusy: a second paymentd on the first one's -listen address
// fails at start with an error naming -listen, within the test's deadline,
// and leaves the payments as they were (held).
func TestListenPortBusy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs := redistest.Start(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	path := filepath.Join(t.TempDir(), "p.db")
	cfg := config{redis: secret("redis://" + rs.Addr), db: secret(path), listen: busy.Addr().String(), seed: 1001}
	if err := run(ctx, cfg); err == nil || !strings.Contains(err.Error(), "-listen") {
		t.Fatalf("run on a busy -listen address: %v, want an error naming -listen", err)
	}
}

// TestStartWithDatabaseThatNeverAnswers: -db names a server that accepts
// connections and never answers (a hung PostgreSQL, a wrong port behind a
// proxy). paymentd must fail at start within its start timeout, naming the
// schema step. Before, it waited there for as long as it ran (here until
// the test's 20 s context ended).
func TestStartWithDatabaseThatNeverAnswers(t *testing.T) {
	rs := redistest.Start(t)
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	defer func() {
		hole.Close()
		<-accepted
		for _, c := range conns {
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	cfg := config{redis: secret("redis://" + rs.Addr), db: secret("postgres://u@" + hole.Addr().String() + "/x?sslmode=disable"),
		listen: "127.0.0.1:0", seed: 1001, startTimeout: time.Second, listening: func(string) { cancel() }}
	err = run(ctx, cfg)
	if took := time.Since(start); err == nil || !strings.Contains(err.Error(), "schema") || took > 10*time.Second {
		t.Fatalf("run against a database that never answers: %v after %v; want a schema error within the 1 s start timeout", err, took.Round(time.Millisecond))
	}
}
