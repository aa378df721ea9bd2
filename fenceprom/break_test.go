package fenceprom_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fencekit/fence"
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

// TestNewRefusesUnsortedBuckets gives New buckets out of order. New
// accepted them, and client_golang panicked at the first observation: in
// the first Acquire's AcquireDone. New must return an error and register
// nothing.
func TestNewRefusesUnsortedBuckets(t *testing.T) {
	for _, opts := range []*fenceprom.Options{
		{WaitBuckets: []float64{1, 0.5}},
		{HoldBuckets: []float64{1, 1}},
	} {
		reg := prometheus.NewRegistry()
		var err error
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("New(%+v) panicked: %v", *opts, p)
				}
			}()
			_, err = fenceprom.New(reg, opts)
		}()
		if !errors.Is(err, fence.ErrInvalidOption) {
			t.Fatalf("New(%+v): %v, want an error matching fence.ErrInvalidOption", *opts, err)
		}
		if _, err := fenceprom.New(reg, nil); err != nil {
			t.Fatalf("New after a refused New: %v", err)
		}
	}
}

// TestNewLeavesNothingRegisteredOnError has a collector of the user's
// already registered as fence_guard_decisions_total, so that New's last
// registration fails. New must not leave its first five behind in reg
// (they were: an identical fence_acquisitions_total could be unregistered).
func TestNewLeavesNothingRegisteredOnError(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "fence_guard_decisions_total", Help: "not fence's"}))
	if _, err := fenceprom.New(reg, nil); err == nil {
		t.Fatal("New registered over a clashing collector")
	}
	same := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fence_acquisitions_total",
		Help: "Acquire calls by backend and result (acquired, held, not_replicated, cancelled, error).",
	}, []string{"backend", "result"})
	if reg.Unregister(same) {
		t.Fatal("a failed New left fence_acquisitions_total registered")
	}
}

// TestNewNilRegisterer: a nil Registerer is bad input, refused with an
// error rather than a nil-pointer panic.
func TestNewNilRegisterer(t *testing.T) {
	var err error
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("New(nil, nil) panicked: %v", p)
			}
		}()
		_, err = fenceprom.New(nil, nil)
	}()
	if !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("New(nil, nil): %v, want an error matching fence.ErrInvalidOption", err)
	}
}

// TestBucketsCopied changes the caller's bucket slice after New: the
// histogram must keep the buckets it was given (client_golang keeps the
// slice itself, so it would report the changed bounds).
func TestBucketsCopied(t *testing.T) {
	reg := prometheus.NewRegistry()
	buckets := []float64{1, 2, 3}
	obs, err := fenceprom.New(reg, &fenceprom.Options{WaitBuckets: buckets})
	if err != nil {
		t.Fatal(err)
	}
	buckets[0] = 0.5
	obs.AcquireDone(fence.AcquireEvent{Backend: "memory", Result: fence.Acquired})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "fence_wait_seconds" {
			continue
		}
		var got []float64
		for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
			got = append(got, b.GetUpperBound())
		}
		if len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 {
			t.Fatalf("buckets %v, want [1 2 3]", got)
		}
		return
	}
	t.Fatal("no fence_wait_seconds")
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

// TestGuardClassesBounded follows the README: Classify keeps what comes
// before the first colon of the resource, and the resource comes from the
// request's path. A client that posts to 1000 resources without a colon
// made 1000 class label values (1000 series kept for ever, each scrape
// larger): the class must be capped, the rest counted as "other".
func TestGuardClassesBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := fenceprom.New(reg, &fenceprom.Options{
		Classify: func(resource string) string { class, _, _ := strings.Cut(resource, ":"); return class },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := guard.Middleware(&guard.MemoryStore{}, guard.HTTPOptions{
		Resource: func(r *http.Request) (string, error) { return r.PathValue("resource"), nil },
		Observer: obs,
	})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	mux := http.NewServeMux()
	mux.Handle("POST /r/{resource}", h)
	const n = 1000
	for i := range n {
		req := httptest.NewRequest(http.MethodPost, fmt.Sprintf("/r/x%d", i), nil)
		req.Header.Set(guard.TokenHeader, "7")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			t.Fatalf("request %d: status %d", i, w.Code)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := 0
	for _, f := range families {
		if f.GetName() == "fence_guard_decisions_total" {
			series = len(f.GetMetric())
		}
	}
	// Two series (accept, reject) per class, "other" included.
	if max := 2 * (fenceprom.DefaultMaxClasses + 1); series > max {
		t.Fatalf("fence_guard_decisions_total has %d series after %d hostile resources, want at most %d", series, n, max)
	}
	if got := counterSum(t, reg, "fence_guard_decisions_total"); got != n {
		t.Fatalf("fence_guard_decisions_total sums to %v, want %d", got, n)
	}
}

// TestNewRefusesNegativeMaxClasses: a negative cap is bad input.
func TestNewRefusesNegativeMaxClasses(t *testing.T) {
	if _, err := fenceprom.New(prometheus.NewRegistry(), &fenceprom.Options{MaxClasses: -1}); !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("New with MaxClasses -1: %v, want an error matching fence.ErrInvalidOption", err)
	}
}
