package payment_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
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

// TestHandlerConcurrentSpellings: 24 concurrent POSTs for payment 1001
// under three spellings of its id, on PostgreSQL and SQLite: one approval
// (200) and one charge; the others find it approved (409) or the lock busy
// (503), never a second charge (held).
func TestHandlerConcurrentSpellings(t *testing.T) {
	e := setup(t)
	for name, db := range e.dbs {
		t.Run(name, func(t *testing.T) {
			svc := &payment.Service{Locker: e.locker, DB: db}
			srv := httptest.NewServer(svc.Handler())
			defer srv.Close()
			codes := make(chan int, 24)
			var wg sync.WaitGroup
			for i := range 24 {
				wg.Go(func() {
					id := [...]string{"1001", "01001", "+1001"}[i%3]
					req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+"/payments/"+id+"/approve", nil)
					req.Header.Set("X-Approver", fmt.Sprint("w", i))
					resp, err := srv.Client().Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					codes <- resp.StatusCode
				})
			}
			wg.Wait()
			close(codes)
			n := map[int]int{}
			for c := range codes {
				n[c]++
			}
			charges, err := payment.Charges(ctx(t), db, 1001)
			if err != nil {
				t.Fatal(err)
			}
			if n[http.StatusOK] != 1 || n[http.StatusOK]+n[http.StatusConflict]+n[http.StatusServiceUnavailable] != 24 || len(charges) != 1 {
				t.Fatalf("answers %v, %d charges; want one 200, the rest 409 or 503, one charge", n, len(charges))
			}
		})
	}
}

// TestHandlerIgnoresClientTokens: paymentd takes the lock and its token
// itself; a client's Fence-Token header (forged, huge, or another lock's)
// is not read, so it can neither approve with a stale token nor block the
// payment with one from the far future (held).
func TestHandlerIgnoresClientTokens(t *testing.T) {
	e := setup(t)
	svc := &payment.Service{Locker: e.locker, DB: e.dbs["postgres"]}
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+"/payments/1001/approve", nil)
	req.Header.Set("X-Approver", "alice")
	req.Header.Set("Fence-Token", "9223372036854775807")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	p, err := payment.Get(ctx(t), e.dbs["postgres"], 1001)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || p.Token == 9223372036854775807 || p.Token <= 0 {
		t.Fatalf("POST with a forged Fence-Token: %d, payment %+v; want 200 with the lease's own token", resp.StatusCode, p)
	}
}
