package main

import (
	"io"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redistest"
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
