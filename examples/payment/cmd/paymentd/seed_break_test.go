package main

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/payment"
	"github.com/fencekit/fence/internal/pgtest"
	"github.com/fencekit/fence/internal/redistest"
)

// TestSeedRace: two paymentd start at once on one PostgreSQL database (the
// README runs several; CreateSchema already tolerates that). Both find
// payment 1001 missing and insert it; the second insert waits for the
// first's and then fails on the primary key. That paymentd must start
// anyway. Before, it exited with "duplicate key value violates unique
// constraint" (here the first insert is the test's, held open until the
// other waits for it).
func TestSeedRace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs := redistest.Start(t)
	pg, err := pgtest.Launch()
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Kill()
	name, err := pg.CreateDatabase(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", pg.DSN(name))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := payment.CreateSchema(ctx, db); err != nil {
		t.Fatal(err)
	}
	first, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback()
	if _, err := first.ExecContext(ctx, `INSERT INTO payment (id, amount) VALUES (1001, 5000)`); err != nil {
		t.Fatal(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	cfg := config{redis: secret("redis://" + rs.Addr), db: secret(pg.DSN(name)), listen: "127.0.0.1:0", seed: 1001,
		listening: func(string) { stop() }}
	runDone := make(chan error, 1)
	go func() { runDone <- run(runCtx, cfg) }()
	// paymentd's insert waits for the uncommitted one.
	for deadline := time.Now().Add(20 * time.Second); ; {
		var waiting int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'`, name).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case err := <-runDone:
			t.Fatalf("run returned (%v) before its insert waited", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("paymentd's seed insert never waited for the other's")
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	if err := first.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-runDone; err != nil {
		t.Fatalf("the second paymentd did not start: %v", err)
	}
}
