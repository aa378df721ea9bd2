package fenceprom_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/fenceprom"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestReadmeScrapeHasZeroSeriesToAlertOn follows the README's example on a
// real redis-server: a lease acquired and released, one write accepted by
// the guard; then scrapes /metrics. The README says to alert on
// fence_leases_lost_total and on guard rejections; but neither series
// existed before its first event, and a rate or increase over a series
// that appears at 1 is nothing: the first lost lease (and the first
// rejection of a class) never fired the alert. They must be there at 0.
func TestReadmeScrapeHasZeroSeriesToAlertOn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg := prometheus.NewRegistry()
	obs, err := fenceprom.New(reg, &fenceprom.Options{
		Classify: func(resource string) string {
			if i := strings.IndexAny(resource, ": "); i >= 0 {
				return resource[:i]
			}
			return resource
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	client := redistest.Start(t).Client(t)
	locker, err := redislock.New(client, &redislock.Options{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := locker.Acquire(ctx, "lock:payment:1001")
	if err != nil {
		t.Fatal(err)
	}
	mw := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{
		Resource: func(r *http.Request) (string, error) { return "payment:" + r.PathValue("id"), nil },
		Observer: obs,
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments/{id}", mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	req := httptest.NewRequest(http.MethodPost, "/payments/1001", nil)
	req.Header.Set(guard.TokenHeader, fmt.Sprint(int64(lease.Token())))
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("guarded write: %d", w.Code)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	want := `
# HELP fence_guard_decisions_total Tokens a guard accepted or rejected as stale, by resource class.
# TYPE fence_guard_decisions_total counter
fence_guard_decisions_total{class="payment",decision="accept"} 1
fence_guard_decisions_total{class="payment",decision="reject"} 0
# HELP fence_leases_lost_total Leases that ended without Release, by backend and cause (expired, renew_failed, renew_late, removed).
# TYPE fence_leases_lost_total counter
fence_leases_lost_total{backend="redis",cause="expired"} 0
fence_leases_lost_total{backend="redis",cause="removed"} 0
fence_leases_lost_total{backend="redis",cause="renew_failed"} 0
fence_leases_lost_total{backend="redis",cause="renew_late"} 0
`
	if err := testutil.ScrapeAndCompare(srv.URL+"/metrics", strings.NewReader(want), "fence_guard_decisions_total", "fence_leases_lost_total"); err != nil {
		t.Fatal(err)
	}
}
