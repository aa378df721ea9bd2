package main

import (
	"context"
	"database/sql"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/payment"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/testmain"
)

func TestMain(m *testing.M) { testmain.Run(m, nil) }

// TestShutdownWaitsForApprovals: SIGTERM (run's ctx done) while an
// approval is in flight, its transaction waiting for the database. run must
// not return before that approval has answered: main exits when run
// returns, and the client would be cut off without learning whether its
// payment was approved. Before, run returned as soon as Shutdown began
// (ListenAndServe returns ErrServerClosed at once), with the approval still
// waiting.
func TestShutdownWaitsForApprovals(t *testing.T) {
	ctx, cancelTest := context.WithTimeout(context.Background(), time.Minute)
	defer cancelTest()
	rs := redistest.Start(t)
	rc := rs.Client(t)
	path := filepath.Join(t.TempDir(), "p.db")
	runCtx, sigterm := context.WithCancel(ctx)
	defer sigterm()
	addr := make(chan string, 1)
	cfg := config{redis: secret("redis://" + rs.Addr), db: secret(path), listen: "127.0.0.1:0", seed: 1001,
		listening: func(a string) { addr <- a }}
	runDone := make(chan error, 1)
	go func() { runDone <- run(runCtx, cfg) }()
	var url string
	select {
	case url = <-addr:
	case err := <-runDone:
		t.Fatalf("run: %v", err)
	}

	// Another transaction holds the database's write lock: the approval
	// waits in its fenced transaction (busy timeout 10 s).
	db, err := sql.Open("sqlite", guard.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	hold, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if _, err := hold.ExecContext(ctx, `UPDATE payment SET amount = amount WHERE id = 1001`); err != nil {
		t.Fatal(err)
	}

	answered := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+url+"/payments/1001/approve", nil)
		req.Header.Set("X-Approver", "alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("POST cut off by the shutdown: %v", err)
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	// The approval is in flight once it holds the payment's lock.
	for deadline := time.Now().Add(10 * time.Second); rc.Exists(ctx, "fence:{"+payment.LockName(1001)+"}").Val() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the approval never took the lock")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	sigterm()
	select {
	case err := <-runDone:
		t.Fatalf("run returned (%v) with an approval in flight", err)
	case <-time.After(2 * time.Second): // run is still waiting for it
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	if code := <-answered; code != http.StatusOK {
		t.Fatalf("the approval in flight answered %d, want 200", code)
	}
	if err := <-runDone; err != nil {
		t.Fatalf("run: %v", err)
	}
}
