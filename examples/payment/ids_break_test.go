package payment_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fencekit/fence/examples/payment"
)

// TestHandlerIDSpellings: the id in the path is a decimal int64; its other
// spellings (leading zeros, a plus sign) name the same payment, and so the
// same lock, so that two spellings cannot approve it twice; anything else
// is a 400, and an id out of int64's range is one too (held).
func TestHandlerIDSpellings(t *testing.T) {
	e := setup(t)
	svc := &payment.Service{Locker: e.locker, DB: e.dbs["postgres"]}
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	post := func(id string) (int, string) {
		req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+"/payments/"+id+"/approve", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Approver", "alice")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, tc := range []struct {
		id   string
		want int
	}{
		{"01001", http.StatusOK},
		{"1001", http.StatusConflict},
		{"+1001", http.StatusConflict},
		{"0001001", http.StatusConflict},
		{"1001.0", http.StatusBadRequest},
		{"1_001", http.StatusBadRequest},
		{"0x3e9", http.StatusBadRequest},
		{"%201001", http.StatusBadRequest},
		{"9223372036854775808", http.StatusBadRequest},
		{"-9223372036854775808", http.StatusNotFound},
		{"99999999999999999999999999999999999999999999", http.StatusBadRequest},
	} {
		if code, body := post(tc.id); code != tc.want {
			t.Errorf("POST /payments/%s/approve: %d %q, want %d", tc.id, code, body, tc.want)
		}
	}
	charges, err := payment.Charges(ctx(t), e.dbs["postgres"], 1001)
	if err != nil || len(charges) != 1 {
		t.Fatalf("charges %+v, %v; want one", charges, err)
	}
}
