package payment_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/payment"
)

// TestHandlerStatementTimeoutIs503: paymentd's database sessions have a
// statement_timeout (here 300 ms, from the connection's options, as a role
// or database setting would give it), and another transaction holds
// payment 1001's row lock, so the approval's statement waits past it and
// PostgreSQL cancels it (SQLSTATE 57014). The statement rolled back, and
// the client may try again, as after a lock_timeout (55P03, 503 with
// Retry-After); it was answered "500 internal error". Now 503 with
// Retry-After. A request whose own context ends while it waits gets 57014
// too (pgx cancels the statement on the server): nobody listens for that
// answer, and it is still logged as an error, not taken for a timeout.
func TestHandlerStatementTimeoutIs503(t *testing.T) {
	e := setup(t)
	db := e.dbs["postgres"]
	var name string
	if err := db.QueryRowContext(ctx(t), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	short, err := sql.Open("pgx", pg.DSN(name)+"&options=-c%20statement_timeout%3D300")
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	hold, err := db.BeginTx(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	if _, err := hold.ExecContext(ctx(t), `SELECT 1 FROM payment WHERE id = 1001 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	logged := new(lockedLog)
	svc := &payment.Service{Locker: e.locker, DB: short, Log: slog.New(slog.NewTextHandler(logged, nil))}
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+"/payments/1001/approve", nil)
	req.Header.Set("X-Approver", "alice")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("answer %d %q; log: %s", resp.StatusCode, body, logged.String())
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || strings.Contains(string(body), "57014") {
		t.Errorf("statement_timeout on the payment's row lock: %d %q Retry-After %q; want 503 with Retry-After and a generic body", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}

	// The request's own context ends while its statement waits for the
	// row lock, well within the statement_timeout: an error, logged.
	long, err := sql.Open("pgx", pg.DSN(name)+"&options=-c%20statement_timeout%3D60000")
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	logged = new(lockedLog)
	svc = &payment.Service{Locker: e.locker, DB: long, Log: slog.New(slog.NewTextHandler(logged, nil))}
	rctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	rec := httptest.NewRecorder()
	r := httptest.NewRequestWithContext(rctx, http.MethodPost, "/payments/1001/approve", nil)
	r.Header.Set("X-Approver", "bob")
	done := make(chan struct{})
	go func() { defer close(done); svc.Handler().ServeHTTP(rec, r) }()
	waitLockWait(t, db)
	cancel()
	<-done
	t.Logf("answer %d %q; log: %s", rec.Code, rec.Body.String(), logged.String())
	if rec.Code == http.StatusServiceUnavailable || !strings.Contains(logged.String(), "level=ERROR") {
		t.Errorf("request cancelled while its statement waited: %d %q, log %q; want no 503, the error logged", rec.Code, rec.Body.String(), logged.String())
	}
}

// waitLockWait waits, for up to 10 s, until a session of db's database
// waits for a lock.
func waitLockWait(t *testing.T, db *sql.DB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		err := db.QueryRowContext(ctx(t), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no session waited for a lock within 10 s")
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}

// lockedLog is a log's text, written by the server's goroutine and read by
// the test's.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
