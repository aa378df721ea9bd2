package guard_test

import (
	"bufio"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencekit/fence/guard"
)

// TestSlowBodyDoesNotHoldOtherResources: a client (a paused worker, or an
// attacker with one valid token) sends a fenced request's headers and then
// trickles its body. Middleware opens SQLStore's transaction before the
// handler reads the body, so on SQLite, whose one writer holds the whole
// file, the upload holds the write lock: a request for another resource
// waits the busy timeout (10 s) and gets 503. How long a transaction lasts
// is then the client's to choose. A request for another resource must be
// served while the slow body is still coming.
func TestSlowBodyDoesNotHoldOtherResources(t *testing.T) {
	t.Skip("bug: Middleware runs the handler, and so the client's upload, inside SQLStore's transaction: on SQLite a slow body holds every resource's writes (503 after the 10 s busy timeout); no small fix (read the body before the store, bounded, or say so)")
	db, err := sql.Open("sqlite", guard.SQLiteDSN(filepath.Join(t.TempDir(), "slow.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := guard.CreateTables(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	reading := make(chan struct{}, 1)
	mw := guard.Middleware(guard.SQLStore{DB: db}, guard.HTTPOptions{
		Resource: func(r *http.Request) (string, error) { return "payment:" + r.PathValue("id"), nil },
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments/{id}", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reading <- struct{}{}
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, "body", http.StatusBadRequest)
		}
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "POST /payments/1 HTTP/1.1\r\nHost: x\r\n%s: 5\r\nContent-Length: 4\r\n\r\nab", guard.TokenHeader); err != nil {
		t.Fatal(err)
	}
	<-reading // payment 1's handler runs, in its transaction, and waits for the rest of the body

	start := time.Now()
	code, _, body := send(t, srv.Client(), srv.URL+"/payments/2", guard.TokenHeader, "1")
	select {
	case <-reading: // payment 2's handler ran
	default:
	}
	if took := time.Since(start); code != http.StatusOK || took > 3*time.Second {
		t.Errorf("payment 2 while payment 1's body is still coming: %d %q after %v, want 200 at once", code, body, took)
	}

	if _, err := io.WriteString(conn, "cd"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("payment 1 once its body arrived: %d, want 200", resp.StatusCode)
	}
}
