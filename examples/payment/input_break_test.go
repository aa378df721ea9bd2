package payment_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fencekit/fence/examples/payment"
)

// TestHandlerBadApprover: an X-Approver that the database cannot store
// (bytes that are not UTF-8: PostgreSQL refuses them) or that no person
// has (over 256 bytes, control characters) is the client's error, a 400,
// and the payment stays pending. Before, PostgreSQL's refusal came back
// from inside the fenced transaction as a 500 "internal error", and the
// library's Approve took any string.
func TestHandlerBadApprover(t *testing.T) {
	e := setup(t)
	for name, db := range e.dbs {
		t.Run(name, func(t *testing.T) {
			svc := &payment.Service{Locker: e.locker, DB: db}
			srv := httptest.NewServer(svc.Handler())
			defer srv.Close()
			for _, by := range []string{"al\xffice", strings.Repeat("a", 257), "alice\tbob"} {
				req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+"/payments/1001/approve", nil)
				req.Header.Set("X-Approver", by)
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusBadRequest {
					t.Errorf("X-Approver %.20q: %d %q, want 400", by, resp.StatusCode, body)
				}
				if _, err := svc.Approve(ctx(t), 1001, by); !errors.Is(err, payment.ErrInvalidApprover) {
					t.Errorf("Approve by %.20q: %v, want ErrInvalidApprover", by, err)
				}
			}
			if p, err := payment.Get(ctx(t), db, 1001); err != nil || p.Status != "PENDING" {
				t.Fatalf("payment after bad approvals: %+v, %v; want it pending", p, err)
			}
		})
	}
}
