package guard_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

type decisions struct {
	fence.NopObserver
	mu     sync.Mutex
	events []fence.GuardEvent
}

func (d *decisions) GuardDecided(e fence.GuardEvent) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.events = append(d.events, e)
}

// stubAcceptor accepts tokens above 5.
type stubAcceptor struct{}

func (stubAcceptor) Accept(_ context.Context, resource string, token fence.Token) error {
	if token <= 5 {
		return &guard.StaleError{Resource: resource, Token: token, Last: 5}
	}
	return nil
}

// TestObserverDecisions: Middleware and Gate report each accepted and each
// stale token once, with the resource without its namespace, and report
// nothing for requests refused before the store is asked.
func TestObserverDecisions(t *testing.T) {
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	resource := func(*http.Request) (string, error) { return "payment:1001", nil }
	for name, mw := range map[string]func(fence.Observer) func(http.Handler) http.Handler{
		"middleware": func(o fence.Observer) func(http.Handler) http.Handler {
			store := &guard.MemoryStore{}
			if err := store.Do(context.Background(), "http:payment:1001", 5, func(context.Context) error { return nil }); err != nil {
				t.Fatal(err)
			}
			return guard.Middleware(store, guard.HTTPOptions{Resource: resource, Observer: o, Now: fixedClock})
		},
		"gate": func(o fence.Observer) func(http.Handler) http.Handler {
			return guard.Gate(stubAcceptor{}, guard.HTTPOptions{Resource: resource, Observer: o, Now: fixedClock})
		},
	} {
		t.Run(name, func(t *testing.T) {
			d := &decisions{}
			h := mw(d)(ok)
			var codes []int
			for _, token := range []string{"7", "3", "bad", "9"} {
				req := httptest.NewRequest(http.MethodPost, "/", nil)
				req.Header.Set(guard.TokenHeader, token)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				codes = append(codes, w.Code)
			}
			if want := []int{200, 409, 400, 200}; !slices.Equal(codes, want) {
				t.Fatalf("codes %v, want %v", codes, want)
			}
			want := []fence.GuardEvent{
				{Resource: "payment:1001", Token: 7, Decision: fence.GuardAccept},
				{Resource: "payment:1001", Token: 3, Decision: fence.GuardReject},
				{Resource: "payment:1001", Token: 9, Decision: fence.GuardAccept},
			}
			if !slices.Equal(d.events, want) {
				t.Fatalf("events %+v, want %+v", d.events, want)
			}
		})
	}
}
