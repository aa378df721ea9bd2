package payment_test

import (
	"database/sql"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/payment"
)

// TestHandlerDatabaseNeverAnswers: the database accepts connections and
// never answers (a hung PostgreSQL), and the client waits as long as it
// takes. Both routes must answer (500) within LockLease and a margin, not
// hold the request for ever. Before, GET waited with no bound, and so did
// POST once Approve read the payment before taking its lock.
func TestHandlerDatabaseNeverAnswers(t *testing.T) {
	e := setup(t)
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		hole.Close()
		<-accepting
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	db, err := sql.Open("pgx", "postgres://u@"+hole.Addr().String()+"/x?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	svc := &payment.Service{Locker: e.locker, DB: db}
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	var wg sync.WaitGroup
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		wg.Go(func() {
			path := "/payments/1001"
			if method == http.MethodPost {
				path += "/approve"
			}
			req, _ := http.NewRequestWithContext(ctx(t), method, srv.URL+path, nil)
			req.Header.Set("X-Approver", "alice")
			start := time.Now()
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Errorf("%s %s: %v after %v", method, path, err, time.Since(start))
				return
			}
			resp.Body.Close()
			if took := time.Since(start); resp.StatusCode != http.StatusInternalServerError || took > payment.LockLease+payment.LockWait+5*time.Second {
				t.Errorf("%s %s with the database hung: %d after %v; want 500 within LockLease", method, path, resp.StatusCode, took)
			}
		})
	}
	wg.Wait()
}
