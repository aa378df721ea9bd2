package payment_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fencekit/fence/examples/payment"
	"github.com/fencekit/fence/internal/pgtest"
)

// TestApprovalsAcrossPostgresRestart: PostgreSQL crashes and comes back
// (immediate shutdown, recovery from the WAL) under a running paymentd
// whose pool holds connections to the old server. The payment approved
// before is still approved (a replay is 409, not a second charge), and the
// first approval after the restart is answered, not failed with a 500 on a
// dead pooled connection.
func TestApprovalsAcrossPostgresRestart(t *testing.T) {
	e := setup(t)
	own, err := pgtest.Launch()
	if err != nil {
		t.Fatal(err)
	}
	defer own.Kill()
	db := own.NewDB(t)
	db.SetMaxIdleConns(4)
	if err := payment.CreateSchema(ctx(t), db); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{1001, 1002} {
		if err := payment.Insert(ctx(t), db, id, 5000); err != nil {
			t.Fatal(err)
		}
	}
	svc := &payment.Service{Locker: e.locker, DB: db}
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	post := func(path string) int {
		req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+path, nil)
		req.Header.Set("X-Approver", "alice")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("/payments/1001/approve"); code != http.StatusOK {
		t.Fatalf("approval before the restart: %d", code)
	}
	// The test server runs with synchronous_commit=off, under which a crash
	// loses the commits of the last WAL writer round. No CHECKPOINT here:
	// the approval's fenced transaction commits durably whatever the
	// setting (guard.Tx), and the schema and rows before it are in the WAL
	// it flushed.
	if err := own.Restart(); err != nil {
		t.Fatal(err)
	}
	if code := post("/payments/1001/approve"); code != http.StatusConflict {
		t.Errorf("replay of 1001 after the restart: %d, want 409", code)
	}
	if code := post("/payments/1002/approve"); code != http.StatusOK {
		t.Errorf("approval of 1002 after the restart: %d, want 200", code)
	}
	for _, id := range []int64{1001, 1002} {
		if charges, err := payment.Charges(ctx(t), db, id); err != nil || len(charges) != 1 {
			t.Errorf("payment %d: charges %+v, %v; want one", id, charges, err)
		}
	}
}
