package fenceprom_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fencekit/fence/fenceprom"
	"github.com/fencekit/fence/guard"
	"github.com/prometheus/client_golang/prometheus"
)

// TestGuardDecisionWithInvalidUTF8Class sends a request for the resource
// "café:1001" through guard.Middleware with a careless Classify that bounds
// its classes by keeping the first 4 bytes: "caf\xc3", not valid UTF-8,
// which client_golang refuses as a label value with a panic, out of the
// guard's handler, after the store accepted the token.
func TestGuardDecisionWithInvalidUTF8Class(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := fenceprom.New(reg, &fenceprom.Options{Classify: func(resource string) string { return resource[:min(len(resource), 4)] }})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	h := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{
		Resource: func(r *http.Request) (string, error) { return r.PathValue("resource"), nil },
		Observer: obs,
	})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true }))
	mux := http.NewServeMux()
	mux.Handle("POST /r/{resource}", h)
	req := httptest.NewRequest(http.MethodPost, "/r/caf%C3%A9:1001", nil)
	req.Header.Set(guard.TokenHeader, "7")
	w := httptest.NewRecorder()
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("GuardDecided panicked on the class %q: %v", "caf\xc3", p)
			}
		}()
		mux.ServeHTTP(w, req)
	}()
	if w.Code != http.StatusOK || !ran {
		t.Fatalf("status %d, handler ran %v; want 200, true", w.Code, ran)
	}
	if got := counterSum(t, reg, "fence_guard_decisions_total"); got != 1 {
		t.Fatalf("fence_guard_decisions_total sums to %v, want 1", got)
	}
}

// counterSum sums the counter metric's values over its label sets.
func counterSum(t *testing.T, reg *prometheus.Registry, metric string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() == metric {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
