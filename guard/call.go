package guard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/fencekit/fence"
)

// CallHeader carries a fenced request's call id: Transport sends a random
// one with every request (the same in net/http's own resends of it, and in
// the requests of the redirects that http.Client follows from it), and
// Middleware and Gate hand it to the store (see WithCall).
const CallHeader = "Fence-Call"

// RecordedCallHeader carries the call ids that stores recorded a call
// under, one a layer: Middleware adds its id to the answer to a call its
// store accepted if that answer is a redirect (3xx, committed), and Gate to
// the answer of a call it admitted, the id they handed the store (a digest
// of the request's Fence-Call, method, target and, for Middleware, body;
// see Middleware). Each adds its id to those already there, rather than
// replace them: with Gate in front of Middleware (in one process, or with
// a reverse proxy between them, which copies the upstream's values after
// Gate's) the answer carries both, each layer's store having recorded its
// own. Transport sends them back on the requests that http.Client makes
// to follow a redirect from that answer, and Middleware and Gate find a
// GET or HEAD request (what http.Client sends after a 301, 302 or 303)
// carrying them to be the call it follows, a replay on the resource that
// accepted it, if their store recorded any one of them with the request's
// token. A request of another method is handed over under its own digest,
// so that a write is not told that another request was applied.
//
// The header is a list: repeated, one id a line, or ids separated by
// commas. At most 4 ids (maxRecordedCalls), each a valid call id (see
// ErrInvalidCall): a request carrying more, an empty one or an invalid one
// is answered 400, and Transport takes nothing from an answer that does.
const RecordedCallHeader = "Fence-Recorded-Call"

// ReplayedHeader is set on the answer to a resend of a call that a store
// found accepted (ErrReplayed): "true" from Middleware (200: the call was
// applied), "admitted" from Gate (409: admitted before, its outcome not
// known, see ProblemAdmitted).
const ReplayedHeader = "Fence-Replayed"

// maxCallBytes bounds a call id; Transport's are 32 bytes.
const maxCallBytes = 128

// maxRecordedCalls bounds the ids of a Fence-Recorded-Call list: one for
// each fenced layer a call went through (Gate in front of Middleware is
// two), with room to spare. Middleware and Gate may ask their store once
// per id, so it also bounds what one request can cost the store.
const maxRecordedCalls = 4

type callKey struct{}

// WithCall returns a copy of ctx that carries call, the id of one call
// (one attempt at one piece of work, sent again only as a resend of
// itself). A store given a token and a call id records the id beside the
// token it accepts; a later call with the same token and the same id is a
// resend of that call, and is answered ErrReplayed, without doing the work
// again, instead of ErrStale. A different id with the same token is stale,
// as without ids: one token, one accepted call per resource. Fence, Tx,
// SQLStore, MemoryStore and redisstore.Store read it; an empty call means
// none. WithCall does not check call: the stores refuse an invalid one
// with ErrInvalidCall. Like context.WithValue, whose context it returns,
// it panics for a nil ctx: it has no error to return, and a nil ctx
// silently replaced by context.Background would lose the caller's
// deadline and cancellation.
func WithCall(ctx context.Context, call string) context.Context {
	return context.WithValue(ctx, callKey{}, call)
}

// CallFrom returns the call id that ctx carries (see WithCall), or "" (a
// nil ctx carries none).
func CallFrom(ctx context.Context) string {
	if ctx == nil {
		return ""
	}
	call, _ := ctx.Value(callKey{}).(string)
	return call
}

// NewCall returns a random call id: 128 bits from crypto/rand, in hex.
func NewCall() string {
	var id [16]byte
	_, _ = rand.Read(id[:]) // never fails (crypto/rand)
	return hex.EncodeToString(id[:])
}

// checkCall refuses a call id that is too long or holds bytes that a header
// value, a Redis key's value or a log line should not carry. "" is no call.
func checkCall(call string) error {
	if len(call) > maxCallBytes {
		return fmt.Errorf("%w: %d bytes, want at most %d", ErrInvalidCall, len(call), maxCallBytes)
	}
	for i := 0; i < len(call); i++ {
		c := call[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return fmt.Errorf("%w: %q holds %q", ErrInvalidCall, call, c)
		}
	}
	return nil
}

// CheckCall returns an error matching ErrInvalidCall if call is not a valid
// call id (see ErrInvalidCall); "" is valid and means no call. Stores
// outside this package use it.
func CheckCall(call string) error { return checkCall(call) }

// ReplayedError is the error of a resend of the call last accepted for
// Resource with Token (see WithCall); it matches ErrReplayed.
type ReplayedError struct {
	Resource string
	Token    fence.Token
	Call     string
}

func (e *ReplayedError) Error() string {
	return fmt.Sprintf("guard: %q: token %d with call %s was already accepted: a resend, not done again", e.Resource, int64(e.Token), e.Call)
}

// Is reports whether target is ErrReplayed.
func (e *ReplayedError) Is(target error) bool { return target == ErrReplayed }
