package guard

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/fencekit/fence"
)

// The headers that carry a fenced request's token and resource.
const (
	TokenHeader    = "Fence-Token"
	ResourceHeader = "Fence-Resource"
)

// Problem is the application/problem+json body (RFC 9457) of a rejected
// request.
type Problem struct {
	Type     string      `json:"type"`
	Title    string      `json:"title"`
	Status   int         `json:"status"`
	Detail   string      `json:"detail"`
	Resource string      `json:"resource,omitempty"`
	Token    fence.Token `json:"token,omitempty"`
	Last     fence.Token `json:"last_accepted_token,omitempty"`
}

// Problem types.
const (
	ProblemStale   = "urn:fence:problem:stale-token"
	ProblemInvalid = "urn:fence:problem:invalid-token"
	ProblemStore   = "urn:fence:problem:store-unavailable"
)

// Middleware admits a request only if its Fence-Token is greater than the
// last token store accepted for its Fence-Resource; the token is recorded
// before next runs. It answers 400 when either header is missing or
// malformed (a token of zero or less, not decimal, or past int64), 409 when
// the token is stale, and 503 when the store fails; these answers have an
// application/problem+json body and next is not called.
//
// The token is spent once admitted, even if next fails: retry with a new
// lease. Where the resource's state lives in a database, a fenced
// transaction (Tx) records the token together with the write instead.
func Middleware(store Store) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			resource := r.Header.Get(ResourceHeader)
			if err := checkResource(resource); err != nil {
				writeProblem(w, Problem{Type: ProblemInvalid, Title: "Invalid fencing resource", Status: http.StatusBadRequest,
					Detail: fmt.Sprintf("header %s: %v", ResourceHeader, err)})
				return
			}
			token, err := ParseToken(r.Header.Get(TokenHeader))
			if err != nil {
				writeProblem(w, Problem{Type: ProblemInvalid, Title: "Invalid fencing token", Status: http.StatusBadRequest,
					Detail: fmt.Sprintf("header %s: %v", TokenHeader, err), Resource: resource})
				return
			}
			var stale *StaleError
			switch err := store.Accept(r.Context(), resource, token); {
			case errors.As(err, &stale):
				writeProblem(w, Problem{Type: ProblemStale, Title: "Stale fencing token", Status: http.StatusConflict,
					Detail: stale.Error(), Resource: resource, Token: token, Last: stale.Last})
			case err != nil:
				writeProblem(w, Problem{Type: ProblemStore, Title: "Fencing token store unavailable", Status: http.StatusServiceUnavailable,
					Detail: err.Error(), Resource: resource, Token: token})
			default:
				next.ServeHTTP(w, r)
			}
		})
	}
}

func writeProblem(w http.ResponseWriter, p Problem) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// Transport is an http.RoundTripper that attaches a lease's token and
// resource to every request. It refuses to send once the lease has ended,
// returning the lease's Err; a holder that paused before noticing is
// stopped by the server's check instead.
type Transport struct {
	Base     http.RoundTripper // nil means http.DefaultTransport
	Lease    fence.Lease
	Resource string // default: the lease's name
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := t.Lease.Err(); err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("guard: not sending %s %s: %w", req.Method, req.URL, err)
	}
	resource := t.Resource
	if resource == "" {
		resource = t.Lease.Name()
	}
	req = req.Clone(req.Context())
	req.Header.Set(TokenHeader, fmt.Sprint(int64(t.Lease.Token())))
	req.Header.Set(ResourceHeader, resource)
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(req)
}
