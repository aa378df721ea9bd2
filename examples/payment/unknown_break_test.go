package payment_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/fencekit/fence/examples/payment"
)

// TestUnknownIDsLeaveNothingInRedis: anyone who can POST can name any of
// 2^64 payment ids. Approving one that does not exist must answer 404
// without taking its lock: each lock name taken leaves a last-token record
// in Redis for TokenRetention (24 h), so a client walking the ids filled
// Redis at will. Before, 200 such POSTs left 200 keys.
func TestUnknownIDsLeaveNothingInRedis(t *testing.T) {
	e := setup(t)
	svc := &payment.Service{Locker: e.locker, DB: e.dbs["postgres"]}
	srv := httptest.NewServer(svc.Handler())
	defer srv.Close()
	before, err := e.redis.DBSize(ctx(t)).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		id := strconv.Itoa(-1 - i*7919)
		if i%2 == 0 {
			id = strconv.Itoa(1_000_000 + i)
		}
		req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+"/payments/"+id+"/approve", nil)
		req.Header.Set("X-Approver", "mallory")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("POST for payment %s, which does not exist: %d, want 404", id, resp.StatusCode)
		}
	}
	after, err := e.redis.DBSize(ctx(t)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		keys, _ := e.redis.Keys(ctx(t), "*").Result()
		t.Fatalf("200 approvals of missing payments left %d keys in Redis (e.g. %q)", after-before, keys[:min(2, len(keys))])
	}
	// The payment that exists is still approved under its lock.
	if _, err := svc.Approve(ctx(t), 1001, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Approve(ctx(t), 4242, "alice"); !errors.Is(err, payment.ErrNotFound) {
		t.Fatalf("Approve of a missing payment: %v, want ErrNotFound", err)
	}
}
