package payment_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fencekit/fence/examples/payment"
)

// TestHandlerGETUsesPOSTFieldNames: a client of paymentd reads the POST's
// answer and the GET's with one set of field names. Before, the POST
// answered {"id","status","approved_by","token"} and the GET answered
// {"ID","Amount","Status","ApprovedBy","Token"} (Payment had no json tags),
// so a client written against one found nothing in the other (approved_by
// missing from the GET).
func TestHandlerGETUsesPOSTFieldNames(t *testing.T) {
	e := setup(t)
	svc := &payment.Service{Locker: e.locker, DB: e.dbs["sqlite"]}
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	decode := func(resp *http.Response, err error) map[string]any {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&m) != nil {
			t.Fatalf("%s %s: %d, or not a JSON object", resp.Request.Method, resp.Request.URL, resp.StatusCode)
		}
		return m
	}
	req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+"/payments/1001/approve", nil)
	req.Header.Set("X-Approver", "alice")
	posted := decode(srv.Client().Do(req))
	got := decode(srv.Client().Get(srv.URL + "/payments/1001"))
	for k, v := range posted {
		if got[k] != v {
			t.Errorf("GET's %q = %v, POST's = %v (GET %v, POST %v)", k, got[k], v, got, posted)
		}
	}
	if got["amount"] != float64(5000) {
		t.Errorf("GET's amount = %v, want 5000 (GET %v)", got["amount"], got)
	}
}
