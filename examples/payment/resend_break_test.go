package payment_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fence/examples/payment"
)

// TestHandlerResentApprovalAfterLostAnswer: a client POSTs the approval of
// payment 1001 with an Idempotency-Key header on a kept-alive connection;
// paymentd approves and charges (committed), and the connection breaks
// before the answer reaches the client (a proxy's idle timeout, a crash
// after the commit). net/http sends the request again by itself (a POST
// with Idempotency-Key is replayable), and the resend is answered 409
// "payment already approved": the client's Do returns a conflict for the
// approval that it made, the one charge being its own. Seen: first attempt
// 200 (lost), resend 409, one charge, approved_by "alice".
func TestHandlerResentApprovalAfterLostAnswer(t *testing.T) {
	e := setup(t)
	db := e.dbs["postgres"]
	svc := &payment.Service{Locker: e.locker, DB: db}
	h := svc.Handler()
	var lost atomic.Bool
	firstCode := make(chan int, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !lost.CompareAndSwap(false, true) {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r) // the approval commits here
		firstCode <- rec.Code
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_ = conn.Close() // and its answer is lost with the connection
	}))
	defer srv.Close()
	c := srv.Client()

	// A GET first, so that the POST goes out on a kept-alive connection:
	// net/http resends only on a reused one.
	resp, err := c.Get(srv.URL + "/payments/1001")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+"/payments/1001/approve", nil)
	req.Header.Set("X-Approver", "alice")
	req.Header.Set("Idempotency-Key", "approve-1001-alice")
	resp, err = c.Do(req)
	if err != nil {
		t.Fatalf("POST: %v (net/http did not resend)", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	first := <-firstCode
	charges, err := payment.Charges(ctx(t), db, 1001)
	if err != nil {
		t.Fatal(err)
	}
	p, err := payment.Get(ctx(t), db, 1001)
	if err != nil {
		t.Fatal(err)
	}
	if !lost.Load() || len(charges) != 1 || p.ApprovedBy != "alice" {
		t.Fatalf("first attempt %d, charges %+v, payment %+v; want alice's one charge", first, charges, p)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first attempt %d (answer lost), resend %d %q; want the client told its approval went through",
			first, resp.StatusCode, strings.TrimSpace(string(body)))
	}
}
