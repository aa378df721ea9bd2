// Package pgtest starts a real PostgreSQL server for tests: initdb in a temp
// dir, postgres on a free loopback port as a child of the test process (so it
// dies with the test), and a fresh database per test. It wraps
// internal/pgtest/pgserver, the same launcher without package testing, for
// code outside tests.
package pgtest

import (
	"context"
	"database/sql"
	"testing"

	"github.com/fencekit/fence/internal/pgtest/pgserver"
)

// Server is one postgres process. The embedded pgserver.Server gives it
// Port and DSN.
type Server struct {
	*pgserver.Server
}

// Launch runs initdb and postgres in a new temp dir and waits until the
// server accepts connections. It is meant for TestMain, which gets no
// testing.TB; the caller must Kill the server.
func Launch() (*Server, error) {
	s, err := pgserver.Start()
	if err != nil {
		return nil, err
	}
	return &Server{s}, nil
}

// Kill stops the server and removes its files.
func (s *Server) Kill() { s.Close() }

// NewDB creates a fresh database for the test and returns a handle to it;
// both are closed and dropped in t.Cleanup.
func (s *Server) NewDB(t testing.TB) *sql.DB {
	t.Helper()
	db, drop, err := s.CreateDB(context.Background(), t.Name())
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(drop)
	return db
}
