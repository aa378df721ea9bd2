package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/pgtest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/refused"
	"github.com/fencekit/fence/internal/silent"
)

// A consumer whose PostgreSQL accepts connections and never answers exits
// with an error at its start (creating the schema) within about its
// connect_timeout, the lease time here. Before, pgx waited for the
// server's answer for good: queued hung with nothing logged.
func TestSilentDatabaseAtStart(t *testing.T) {
	srv := redistest.Start(t)
	cfg, err := parseFlags([]string{"-redis", "redis://" + srv.Addr, "-lease", "1s",
		"-db", "postgres://postgres@" + silent.Addr(t) + "/postgres?sslmode=disable"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- run(cfg, "") }()
	const limit = 10 * time.Second // the connect_timeout is 1 s
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("run returned no error")
		}
		t.Logf("after %v: %v", time.Since(start), err)
	case <-time.After(limit):
		t.Fatalf("run still waiting for the database after %v", limit)
	}
}

// A consumer whose Redis is down at its start (refused, or accepting and
// never answering) exits with an error within about a lease time, as it
// does when PostgreSQL is down. Before, it created the schema and then
// campaigned for good, every acquisition failing, with nothing logged.
func TestRedisDownAtStart(t *testing.T) {
	pg, err := pgtest.Launch()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Kill)
	dbName, err := pg.CreateDatabase(t.Context(), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	for name, addr := range map[string]string{"refused": refused.Addr(t), "silent": silent.Addr(t)} {
		t.Run(name, func(t *testing.T) {
			cfg, err := parseFlags([]string{"-redis", "redis://" + addr, "-lease", "1s", "-db", pg.DSN(dbName)},
				func(string) string { return "" }, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- run(cfg, "") }()
			const limit = 10 * time.Second // the lease is 1 s
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "-redis") {
					t.Fatalf("run: %v, want an error about -redis", err)
				}
				t.Log(err)
			case <-time.After(limit):
				t.Fatalf("run still campaigning on a Redis that is down after %v", limit)
			}
		})
	}
}
