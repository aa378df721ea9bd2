package guard_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
)

// TestTransportWithoutLeaseRefuses: a guard.Transport built without its
// Lease refuses to send, with an error matching fence.ErrInvalidOption,
// and closes the request's body (as a RoundTripper must). Before,
// RoundTrip panicked with a nil pointer dereference inside the caller's
// http.Client.Do.
func TestTransportWithoutLeaseRefuses(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer srv.Close()
	c := &http.Client{Transport: &guard.Transport{Base: srv.Client().Transport, Resource: "payment:1001"}}
	body := &closeCounter{Reader: strings.NewReader("approve")}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, body)
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Do through a Transport without a Lease panicked: %v", r)
			}
		}()
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		if !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("Do through a Transport without a Lease = %v; want an error matching fence.ErrInvalidOption", err)
		}
	}()
	if hits.Load() != 0 || !body.closed.Load() {
		t.Errorf("server hit %d times, body closed %v; want nothing sent and the body closed", hits.Load(), body.closed.Load())
	}
}

type closeCounter struct {
	*strings.Reader
	closed atomic.Bool
}

func (c *closeCounter) Close() error { c.closed.Store(true); return nil }
