package guard

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekit/fence"
)

// The headers that carry a fenced request's token and resource. The server
// reads ResourceHeader only if it opts in with ResourceFromHeader.
const (
	TokenHeader    = "Fence-Token"
	ResourceHeader = "Fence-Resource"
)

// Defaults of HTTPOptions.
const (
	DefaultNamespace = "http:"
	DefaultMaxAhead  = time.Hour
	DefaultMaxBody   = 1 << 20 // 1 MiB
)

// HTTPOptions configures Middleware and Gate.
type HTTPOptions struct {
	// Resource chooses the resource a request may touch, from the request
	// as the server sees it: its path or route, the authenticated caller.
	// It is required. An error, or an empty name, answers 400 and is
	// logged. It must give one name per protected thing: built from the
	// raw path segment, /payments/1001 and /payments/01001 would be two
	// resources, each with its own last token, for the one row that the
	// handler's strconv.ParseInt finds for both. Parse and format the key.
	// r.PathValue is set by the ServeMux only for the handler it routes
	// to: with Middleware wrapping the ServeMux itself, it is empty, and
	// "payment:" + r.PathValue("id") names one resource for every request
	// (tokens of different locks then compared on it; refuse an empty
	// value instead). ResourceFromHeader lets the client choose instead.
	Resource func(*http.Request) (string, error)

	// Namespace goes before every resource name in the store, so that the
	// last tokens of HTTP requests and of Tx on the same database do not
	// collide. Empty means DefaultNamespace ("http:"). To share a resource
	// with Tx on purpose, give Tx the prefixed name ("http:payment:1001").
	Namespace string

	// MaxAhead refuses tokens greater than the clock's time in microseconds
	// plus MaxAhead, so that one forged token (the int64 maximum, say)
	// cannot block a resource for good. redislock's tokens are a counter or
	// the Redis server's clock in microseconds, whichever is greater, so a
	// real one is never far ahead of the wall clock (unless the Redis
	// server's clock is ahead of this one by more than MaxAhead: then real
	// tokens are refused too). It bounds the harm, it does not prevent it:
	// a forged token just under the limit still blocks the resource until
	// the clock passes it (up to MaxAhead), and against tokens that are not
	// clock-floored (memlock's count from 1, as may other counters) any
	// forged token near the clock blocks the resource for good. Only
	// clients trusted with the resource should be able to send tokens.
	// Zero means DefaultMaxAhead (one hour); a negative value turns the
	// check off.
	MaxAhead time.Duration

	// MaxBody bounds the request body that Middleware reads, whole, before
	// it asks the store, so that the store's hold (SQLStore's transaction,
	// on SQLite the database's one write lock) lasts as long as the
	// handler's work, not as long as the client takes to upload: a client
	// that trickles its body holds only its own request. A body larger
	// than MaxBody is answered 413 without asking the store. Every request
	// being read holds up to MaxBody bytes in memory. Zero means
	// DefaultMaxBody (1 MiB), enough for the commands fenced requests
	// carry. A negative value reads nothing ahead: the handler reads the
	// body from the client inside the store's hold, so the client chooses
	// how long the hold lasts (bound it with http.Server's ReadTimeout).
	// Gate does not read ahead: it holds nothing while the handler runs.
	MaxBody int64

	// Now is the clock MaxAhead is measured from; nil means time.Now.
	Now func() time.Time

	// Logger receives the details that error bodies leave out: store
	// failures at level Error, rejected requests at level Debug. Nil means
	// slog.Default().
	Logger *slog.Logger

	// Observer, if not nil, is told of every token the store accepted or
	// rejected as stale (fence.GuardEvent, with the resource without the
	// Namespace). Requests refused before the store is asked (400) and
	// store failures (503) are not decisions on a token and are not
	// reported. Accept is told when the store lets the handler run: with
	// SQLStore, a handler that fails rolls the token back with its
	// writes, and the same token sent again is accepted, and told, again.
	// A resend answered as a replay (ErrReplayed) is not reported: the
	// token was told accepted once, when its call was.
	Observer fence.Observer
}

// ResourceFromHeader takes the resource from the request's Fence-Resource
// header: the client chooses which resource it fences. Use it only where
// any client may fence any resource of the namespace, and with a store that
// bears as many resources as clients may name (SQLStore, redisstore; not
// MemoryStore, which keeps every name it is asked about).
func ResourceFromHeader(r *http.Request) (string, error) {
	v := r.Header.Values(ResourceHeader)
	if len(v) != 1 {
		return "", fmt.Errorf("%w: want one %s header, got %d", ErrInvalidResource, ResourceHeader, len(v))
	}
	return v[0], nil
}

// Problem is the application/problem+json body (RFC 9457) of a rejected
// request. Its Detail is a fixed sentence; the cause is logged instead.
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
	ProblemStale    = "urn:fence:problem:stale-token"
	ProblemInvalid  = "urn:fence:problem:invalid-token"
	ProblemResource = "urn:fence:problem:invalid-resource"
	ProblemStore    = "urn:fence:problem:store-unavailable"
	ProblemTooLarge = "urn:fence:problem:body-too-large"
	ProblemBody     = "urn:fence:problem:unreadable-body"
	ProblemCall     = "urn:fence:problem:invalid-call"

	// ProblemReplayed is the type of the answer to a resend of a call that
	// was applied (ErrReplayed): 200, Fence-Replayed: true, and a Problem
	// as an application/json body. It is not an error.
	ProblemReplayed = "urn:fence:problem:replayed"

	// ProblemAdmitted is the type of Gate's answer to a resend of a call
	// it admitted before: 409, Fence-Replayed: admitted. Gate spends the
	// token at admission and does not know what the handler did (it may
	// have failed, or still be running): the call is not run again, and
	// the caller must read the state to learn its outcome.
	ProblemAdmitted = "urn:fence:problem:admitted"

	// ProblemStoreLost is the type of the 503 answer to a token the store
	// refused by its floor (ErrStoreLost): the store lost its state after
	// the token was issued. The client acquires a new lease and sends the
	// request again with its token.
	ProblemStoreLost = "urn:fence:problem:store-lost"

	// ProblemNotReplicated is the type of the 503 answer when the store
	// recorded the token on its primary but too few replicas acknowledged
	// it in time (fence.ErrNotReplicated; redisstore.Store with Replicas):
	// the handler was not run, and the token counts as spent (a failover
	// may or may not keep it). The client acquires a new lease and sends
	// the request again with its token. A resend of the refused call with
	// the same token and Fence-Call is answered ProblemNotReplicated
	// again: it never ran (redisstore.Store marks the refused call's
	// record; where that mark was lost, ProblemAdmitted, false but safe).
	ProblemNotReplicated = "urn:fence:problem:not-replicated"
)

// Middleware runs a request's handler only if the request's Fence-Token is
// greater than the last token store accepted for the request's resource,
// and orders the check with the handler's writes: store.Do holds the
// resource from the check until the handler has returned (SQLStore: the
// handler runs inside the fenced transaction, reached with TxFrom;
// MemoryStore: the resource's requests run one at a time). A request with
// an older token therefore cannot write after a newer one was accepted.
//
// Middleware reads the request body, up to HTTPOptions.MaxBody, before it
// asks the store, and hands the handler a request whose Body, GetBody and
// ContentLength are those of the bytes read: a client that sends its body
// slowly holds its own request, not the resource (with SQLStore, the
// transaction, and on SQLite the whole database's write lock). A body
// larger than MaxBody is answered 413 and one that cannot be read (the
// client went away, a malformed chunk) 400, and the store is not asked.
// A body whose Content-Length is over MaxBody is refused unread (a client
// that sent Expect: 100-continue sends nothing). The read ends, with the
// same 400, when the request's context does, where the ResponseWriter can
// set a read deadline (see http.ResponseController; http.TimeoutHandler's
// cannot, and its 503 then waits for the client's last byte, since
// net/http writes no answer while a read holds the body: bound the read
// with http.Server's ReadTimeout), and an HTTP/1.x connection whose read
// deadline was moved is then closed; a request whose context has ended is
// not taken to the store. With a negative MaxBody the handler reads the
// body itself, inside the hold.
//
// The handler's writes must be done when it returns: a handler that leaves
// work running is no longer ordered (http.TimeoutHandler inside
// Middleware returns at its timeout, 503, and leaves the handler running
// on its goroutine). With SQLStore such a late write through TxFrom's
// transaction fails, the transaction having ended; with MemoryStore, or
// a write elsewhere, it lands whenever it does, after newer tokens'. Put
// TimeoutHandler outside Middleware.
//
// A store that runs fn more than once (one that retries after ErrRetry)
// runs the handler afresh each time, with an empty response and the whole
// body read ahead; the last run's answer is the one that decides the
// commit and that the client gets. A store that returns nil without
// running the handler is a store failure (503).
//
// The handler's response is held in memory until store.Do returns, so
// that a client is never told of writes that were then rolled back:
// streaming, Flush and Hijack are not available to the handler. A 2xx or
// 3xx answer commits (303 See Other is the usual answer to a POST that
// succeeded), except 307 and 308, which ask the client to send the same
// request, with its token, to another URL; any other status (4xx, 5xx,
// 1xx, 307, 308), or a panic, makes store.Do fail (with SQLStore: rolls
// back, the token is not spent, and the redirected request can use it).
// The handler's own answer is then sent as written, and a panic is
// re-raised once the store has rolled back. When the store fails, the client gets 503 and a generic
// body, and the cause goes to the log; a failure of SQLStore's commit
// itself (a deadline, a lost connection) may follow a commit that
// happened (see Tx), so a 503 does not prove that nothing was written.
//
// Before the store is asked, a request is refused with 400 when its
// resource cannot be chosen or its token is missing, malformed (see
// ParseToken), sent twice, or too far ahead of the clock (see
// HTTPOptions.MaxAhead), or its Fence-Call header is sent twice or is
// not a call id (see ErrInvalidCall), or its Fence-Recorded-Call list
// holds more than 4 ids, an empty one or one that is not a call id; then
// with 413 or 400 when its body is too large or cannot be read; and with
// 409 when the store finds the token stale. These answers carry an application/problem+json body.
//
// The request's Fence-Call header (CallHeader), which Transport sends, is
// handed to the store as the call id (WithCall). A request with the last
// accepted token and the call id it was accepted with is a resend of that
// call (net/http resends a request whose connection broke before the
// answer): the store does not run the handler, and Middleware answers 200
// with the header Fence-Replayed: true and an application/json Problem
// body of type ProblemReplayed. The handler's first answer is not kept: a client
// that needs it reads the state again. Without Fence-Call, or with another
// one, the same token is stale (409), as before. The call id handed to the
// store covers the request's method, target (path and query) and body as
// well as its Fence-Call: a different request sent with the same Fence-Call
// (or Idempotency-Key) under the same lease is not a resend, and is
// answered 409 stale, not told it was applied. (The IETF Idempotency-Key
// draft's 422 for a reused key would need the store to keep the digest
// apart from the id.) With a negative MaxBody the body is not covered.
// A committed redirect (3xx) carries the id handed to the store in its
// Fence-Recorded-Call list (RecordedCallHeader), after the ids already
// there (an outer Gate's, or an inner layer's that the handler's answer
// carries), and a GET or HEAD request that carries a list is handed to the
// store under its ids, as they are, one after the other until the store
// does not find the token spent by another call (at most 4 asks):
// Transport sends the list on the request that follows a redirect, which
// is the same call (see Transport), and which after Middleware's 301, 302
// or 303 is a GET or a HEAD. Like Fence-Call, it is the client's word: a
// client that sends another call's recorded id with that call's token on
// a GET or HEAD is told that call was applied, not refused. A request of
// another method is handed over under its digest, header or not, so that
// a write is never told that another request was applied.
//
// Middleware panics if opts.Resource is nil, if opts.Namespace is not a
// valid start of a lock name (fence.ValidateName: braces, control
// characters, not UTF-8, too long), or if opts.Observer holds a nil
// pointer (fence.ValidateObserver).
func Middleware(store Store, opts HTTPOptions) func(http.Handler) http.Handler {
	g := newHTTPGuard(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			resource, token, call, recorded, ok := g.admit(w, r)
			if !ok {
				return
			}
			if r, ok = g.readBody(w, r, resource); !ok {
				return
			}
			// A store may run fn more than once (one that retries after
			// ErrRetry): each run starts afresh, with an empty response
			// and the whole body, and the last run's answer is the one
			// its commit decides on and the client gets.
			var buf *responseBuffer
			var p recovered
			var handed *http.Request // the copy the last run was given
			id, err := tryCalls(requestCalls(call, recorded, r, g.maxBody >= 0), token, func(id string) error {
				return store.Do(WithCall(r.Context(), id), g.namespace+resource, token, func(ctx context.Context) error {
					removeForm(handed, r)
					g.decided(resource, token, fence.GuardAccept)
					buf, p = &responseBuffer{header: make(http.Header)}, recovered{}
					handed = r.WithContext(ctx)
					if r.GetBody != nil && g.maxBody >= 0 {
						handed.Body, _ = r.GetBody() // the bytes read ahead, from the start
					}
					return serve(next, buf, handed, &p)
				})
			})
			removeForm(handed, r)
			if err == nil && buf == nil {
				err = errNotRun
			}
			switch {
			case p.did:
				if !only(err, errPanicked) {
					g.storeFailed(r, resource, token, err)
				}
				panic(p.value)
			case err == nil:
				if id != "" && buf.status >= 300 {
					// Transport reads it only from a redirect's answer:
					// on others it would cost allocations and bytes. The
					// ids of an outer Gate (set on w) and of inner layers
					// (in the handler's answer) stay: each of those
					// stores recorded the call under its own.
					inner := buf.header.Values(RecordedCallHeader)
					buf.header.Del(RecordedCallHeader)
					for _, ids := range [][]string{w.Header().Values(RecordedCallHeader), inner, {id}} {
						for _, v := range ids {
							addRecorded(buf.header, v)
						}
					}
				}
				buf.sendTo(w)
			case errors.Is(err, errHandlerStatus):
				if !only(err, errHandlerStatus) {
					g.storeFailed(r, resource, token, err)
				}
				buf.sendTo(w)
			default:
				g.reject(w, r, resource, token, err)
			}
		})
	}
}

// requestCalls returns the call ids that Middleware and Gate hand the
// store for a request with Fence-Call call and Fence-Recorded-Call list
// recorded, to be tried in turn (see tryCalls). Most requests have one: a
// digest of call with the request's method, target (path and query) and,
// if withBody, the body read ahead (r.GetBody), so that a caller that sent
// two different requests with one Fence-Call (one Idempotency-Key, from
// which Transport derives it) is not told the second was applied: it is
// another call, stale with that token. A resend, byte for byte the same
// request, is the same call. Without call the one id is "", none. A GET
// or HEAD that carries a list is handed over under its ids, as they are
// (see RecordedCallHeader).
func requestCalls(call string, recorded []string, r *http.Request, withBody bool) []string {
	if len(recorded) > 0 && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		// A redirect's follow-up, sent by Transport: the call it follows,
		// under the ids the stores of the layers it went through recorded
		// it with (admit checked them). Middleware commits no 307 or 308,
		// so a follow-up of its answer is what http.Client sends after a
		// 301, 302 or 303: a GET or a HEAD. A write carrying the header is
		// covered by its digest, so that it is not told that another
		// request was applied.
		return recorded
	}
	if call == "" {
		return []string{""}
	}
	h := sha256.New()
	for _, part := range []string{call, r.Method, r.URL.RequestURI()} {
		_, _ = fmt.Fprintf(h, "%d:%s", len(part), part)
	}
	if withBody && r.GetBody != nil {
		if body, err := r.GetBody(); err == nil { // the bytes read ahead: never fails
			_, _ = io.Copy(h, body)
			_ = body.Close()
		}
	}
	return []string{"req-" + hex.EncodeToString(h.Sum(nil)[:16])}
}

// tryCalls asks the store (ask) with each of ids in turn, until it answers
// other than a *StaleError that leaves token the last accepted one (the
// token spent by another call, as far as that id goes), and returns the
// id it stopped at and the store's answer. A stale token (a newer one
// accepted) ends it at the first id: no id makes it less stale.
//
// A follow-up's ids are one a layer that recorded the call, and each store
// knows only its own, so each layer must try them all. Trying them gives
// the holder of the token nothing it could not get by sending the request
// once per id, each with that one id in its header, and stopping at the
// first answer that is not stale: a *StaleError records nothing (Store and
// Acceptor), so the asks that came before change nothing, and the one
// that decides is the very ask such a request would make. An id that the
// store did not record with this token on this resource is not the call:
// alone it is stale, and in a list it is passed over; a lower token is
// stale whatever the ids.
func tryCalls(ids []string, token fence.Token, ask func(id string) error) (string, error) {
	var err error
	for _, id := range ids {
		err = ask(id)
		var stale *StaleError
		if !errors.As(err, &stale) || stale.Last > token {
			return id, err
		}
	}
	return ids[len(ids)-1], err
}

// addRecorded adds id to h's Fence-Recorded-Call list, unless it is there
// already (two layers on one store, under one namespace).
func addRecorded(h http.Header, id string) {
	for _, v := range h.Values(RecordedCallHeader) {
		if v == id {
			return
		}
	}
	h.Add(RecordedCallHeader, id)
}

// removeForm removes the temporary files of a multipart form that the
// handler parsed from handed, its copy of r: net/http removes those of the
// request it handed over, not of a copy's.
func removeForm(handed, r *http.Request) {
	if handed != nil && handed.MultipartForm != nil && handed.MultipartForm != r.MultipartForm {
		_ = handed.MultipartForm.RemoveAll()
	}
}

// Gate is a gate only: it records the request's token with a, when the
// request arrives, and then runs the handler, which writes whenever it
// does. It does not order the check with the handler's writes: a request
// with token 5 admitted before one with token 7 may still write after it,
// and the final state is then 5's. Use it where a store can do no more (a
// redisstore.Store in front of writes to another system) and the handler's
// writes are fenced again where they land, or their order does not
// matter. Otherwise use Middleware with a Store.
//
// It checks and answers as Middleware does, except that the handler writes
// its response directly, the token is spent once admitted, even if the
// handler fails, and the body is not read ahead (Gate holds nothing while
// the handler runs; HTTPOptions.MaxBody does not apply). A resend of an
// admitted call (same token, Fence-Call, method and target, see
// Middleware) is not run again; since the token is spent at admission and
// Gate does not know what the handler did (it may have failed, crashed,
// or still be running), it is answered 409 with Fence-Replayed: admitted
// and a Problem of type ProblemAdmitted, not 200: the caller reads the
// state to learn the outcome. The answer of an admitted call carries the
// id handed to the store in its RecordedCallHeader list, as Middleware's
// committed redirects do (Gate adds it before the handler chooses its
// status, after an outer layer's): a redirect that Transport follows from
// it to a page behind Gate on the same resource, with a GET or HEAD, is
// answered so too (409, Fence-Replayed: admitted), the handler's redirect
// not shown to the caller. With Middleware behind Gate, in the same
// process or through a reverse proxy (which copies the upstream's ids
// after Gate's), the answer carries both layers' ids, and the follow-up is
// Gate's 409 admitted, not stale: each layer tries every id of the list
// (see Middleware).
//
// Gate panics if opts.Resource is nil, opts.Namespace is invalid or
// opts.Observer holds a nil pointer, as Middleware does.
func Gate(a Acceptor, opts HTTPOptions) func(http.Handler) http.Handler {
	g := newHTTPGuard(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			resource, token, call, recorded, ok := g.admit(w, r)
			if !ok {
				return
			}
			id, err := tryCalls(requestCalls(call, recorded, r, false), token, func(id string) error {
				return a.Accept(WithCall(r.Context(), id), g.namespace+resource, token)
			})
			if err != nil {
				if errors.Is(err, ErrReplayed) {
					g.admittedBefore(w, r, resource, token, err)
					return
				}
				g.reject(w, r, resource, token, err)
				return
			}
			g.decided(resource, token, fence.GuardAccept)
			if id != "" {
				// Added, not set: an outer layer's id stays, its store
				// having recorded the call under it.
				addRecorded(w.Header(), id)
			}
			next.ServeHTTP(w, r)
		})
	}
}

type httpGuard struct {
	resource  func(*http.Request) (string, error)
	namespace string
	maxAhead  time.Duration
	maxBody   int64
	now       func() time.Time
	log       *slog.Logger
	obs       fence.Observer // nil: none
}

func newHTTPGuard(o HTTPOptions) *httpGuard {
	if o.Resource == nil {
		panic("guard: HTTPOptions.Resource is nil")
	}
	g := &httpGuard{resource: o.Resource, namespace: o.Namespace, maxAhead: o.MaxAhead, maxBody: o.MaxBody, now: o.Now, log: o.Logger, obs: o.Observer}
	if g.namespace == "" {
		g.namespace = DefaultNamespace
	}
	if err := fence.ValidateName(g.namespace); err != nil {
		// No request's resource could pass the check: every one would be
		// answered 400, logged at Debug only.
		panic(fmt.Sprintf("guard: HTTPOptions.Namespace %q cannot start a resource name: %v", g.namespace, err))
	}
	if err := fence.ValidateObserver(o.Observer); err != nil {
		// It would panic at the first decision, after the store
		// committed, behind a recover that answers 503.
		panic("guard: HTTPOptions." + err.Error())
	}
	if g.maxAhead == 0 {
		g.maxAhead = DefaultMaxAhead
	}
	if g.maxBody == 0 {
		g.maxBody = DefaultMaxBody
	}
	if g.now == nil {
		g.now = time.Now
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	return g
}

// admit chooses the request's resource and reads its token, call id and
// recorded call ids; when one is unusable it answers 400 and returns false.
func (g *httpGuard) admit(w http.ResponseWriter, r *http.Request) (string, fence.Token, string, []string, bool) {
	resource, err := g.resource(r)
	if err == nil && resource == "" {
		// Not a resource but a chooser's mistake (r.PathValue before the
		// ServeMux has set it, say): every such request would share the
		// namespace's one resource.
		err = fmt.Errorf("%w: the chooser returned an empty name", ErrInvalidResource)
	}
	if err == nil {
		err = checkResource(g.namespace + resource)
	}
	if err != nil {
		g.debug(r, "guard: no fenced resource for the request", err)
		writeProblem(w, Problem{Type: ProblemResource, Title: "No fenced resource", Status: http.StatusBadRequest,
			Detail: "The server could not tell which fenced resource this request is for."})
		return "", 0, "", nil, false
	}
	token, err := g.token(r)
	if err != nil {
		g.debug(r, "guard: invalid fencing token", err, slog.String("resource", resource))
		writeProblem(w, Problem{Type: ProblemInvalid, Title: "Invalid fencing token", Status: http.StatusBadRequest,
			Detail: "Send one " + TokenHeader + " header: the lease's token, a decimal number from 1 to " +
				strconv.FormatInt(1<<63-1, 10) + ", not far ahead of the server's clock.",
			Resource: resource})
		return "", 0, "", nil, false
	}
	call, err := headerCall(r.Header, CallHeader)
	var recorded []string
	if err == nil {
		recorded, err = recordedCalls(r.Header)
	}
	if err != nil {
		g.debug(r, "guard: invalid call id", err, slog.String("resource", resource))
		writeProblem(w, Problem{Type: ProblemCall, Title: "Invalid call id", Status: http.StatusBadRequest,
			Detail: "Send at most one " + CallHeader + " header and at most " + strconv.Itoa(maxRecordedCalls) + " ids in " + RecordedCallHeader +
				", each 1 to 128 ASCII letters, digits, '-', '_', '.' or ':'.",
			Resource: resource, Token: token})
		return "", 0, "", nil, false
	}
	return resource, token, call, recorded, true
}

// headerCall returns the call id of h's header name, "" if there is none,
// and an error matching ErrInvalidCall if it is sent twice, empty or not a
// call id.
func headerCall(h http.Header, name string) (string, error) {
	switch v := h.Values(name); len(v) {
	case 0:
		return "", nil
	case 1:
		if v[0] == "" {
			return "", fmt.Errorf("%w: an empty %s header", ErrInvalidCall, name)
		}
		return v[0], checkCall(v[0])
	default:
		return "", fmt.Errorf("%w: want at most one %s header, got %d", ErrInvalidCall, name, len(v))
	}
}

// recordedCalls returns the ids of h's Fence-Recorded-Call list (header
// lines, each one id or ids separated by commas), nil if there is none,
// and an error matching ErrInvalidCall, with no ids, if it holds more than
// maxRecordedCalls, an empty one or one that is not a call id. Checked
// whole, as Fence-Call is: a list that is partly wrong was not made by
// Middleware, Gate or Transport, and would only be read by guessing.
func recordedCalls(h http.Header) ([]string, error) {
	lines := h.Values(RecordedCallHeader)
	if len(lines) == 0 {
		return nil, nil
	}
	var ids []string
	for _, line := range lines {
		for id := range strings.SplitSeq(line, ",") {
			if id = strings.Trim(id, " \t"); id == "" {
				return nil, fmt.Errorf("%w: an empty id in %s", ErrInvalidCall, RecordedCallHeader)
			}
			if err := checkCall(id); err != nil {
				return nil, err
			}
			if ids = append(ids, id); len(ids) > maxRecordedCalls {
				return nil, fmt.Errorf("%w: more than %d ids in %s", ErrInvalidCall, maxRecordedCalls, RecordedCallHeader)
			}
		}
	}
	return ids, nil
}

// readBody reads r's body, up to g.maxBody bytes, and returns a shallow
// copy of r that carries the bytes read; when the body is too large, cannot
// be read, or r's context ends, it answers 413 or 400 and returns false.
// With a negative g.maxBody it returns r as it is.
func (g *httpGuard) readBody(w http.ResponseWriter, r *http.Request, resource string) (*http.Request, bool) {
	if g.maxBody < 0 || r.Body == nil || r.Body == http.NoBody {
		return r, true
	}
	var body []byte
	err := error(&http.MaxBytesError{Limit: g.maxBody})
	if r.ContentLength <= g.maxBody { // else refused unread: with Expect: 100-continue, the client sends nothing
		body, err = g.readAll(w, r)
	}
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			g.debug(r, "guard: request body too large", err, slog.String("resource", resource),
				slog.Int64("content_length", r.ContentLength))
			writeProblem(w, Problem{Type: ProblemTooLarge, Title: "Request body too large", Status: http.StatusRequestEntityTooLarge,
				Detail:   "The request body is larger than the server accepts for a fenced request.",
				Resource: resource})
			return nil, false
		}
		g.debug(r, "guard: request body unreadable", err, slog.String("resource", resource))
		writeProblem(w, Problem{Type: ProblemBody, Title: "Unreadable request body", Status: http.StatusBadRequest,
			Detail: "The server could not read the whole request body.", Resource: resource})
		return nil, false
	}
	r2 := new(http.Request)
	*r2 = *r
	r2.ContentLength = int64(len(body))
	r2.TransferEncoding = nil // the body is now of known length
	if len(body) == 0 {
		r2.Body = http.NoBody
		r2.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
	} else {
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	return r2, true
}

// readAll reads r's body through http.MaxBytesReader (which, over the
// limit, also has net/http close the connection after the answer). When
// r's context ends first, it moves the connection's read deadline to the
// past, where w supports it, so that the read stops, and returns the
// context's cause: a client gone mid-body is not taken to the store.
func (g *httpGuard) readAll(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	ctx := r.Context()
	if ctx.Err() != nil {
		// Ended already: read nothing (Expect: 100-continue would invite
		// the body) and leave the connection's deadline to net/http.
		return nil, fmt.Errorf("guard: reading the request body: %w", context.Cause(ctx))
	}
	interrupted := make(chan struct{})
	var moved bool // set before interrupted is closed
	stop := context.AfterFunc(ctx, func() {
		defer close(interrupted)
		moved = http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0)) == nil
	})
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.maxBody))
	if !stop() {
		// The deadline was moved, or is being moved: wait, since w must not
		// be used once the handler has returned.
		<-interrupted
		if moved && r.ProtoMajor == 1 {
			// The HTTP/1.x connection's read deadline is now in the past,
			// and a read that failed on it (net/http's own, once the body
			// was whole) has cancelled the connection's context, the parent
			// of every later request's: do not keep the connection alive.
			// (HTTP/2 moved only this stream's deadline; there "Connection:
			// close" would shut the whole connection down.)
			w.Header().Set("Connection", "close")
		}
		return nil, fmt.Errorf("guard: reading the request body: %w", errors.Join(context.Cause(ctx), err))
	}
	if err != nil {
		return nil, fmt.Errorf("guard: reading the request body: %w", err)
	}
	return body, nil
}

func (g *httpGuard) token(r *http.Request) (fence.Token, error) {
	v := r.Header.Values(TokenHeader)
	if len(v) != 1 {
		return 0, fmt.Errorf("%w: want one %s header, got %d", ErrInvalidToken, TokenHeader, len(v))
	}
	token, err := ParseToken(v[0])
	if err != nil {
		return 0, err
	}
	if g.maxAhead > 0 {
		now := g.now()
		nowµs, ahead := now.UnixMicro(), g.maxAhead.Microseconds()
		if nowµs < math.MaxInt64-ahead && int64(token) > nowµs+ahead {
			return 0, fmt.Errorf("%w: %d is more than %v ahead of the clock (%d µs at %v)",
				ErrInvalidToken, token, g.maxAhead, now.UnixMicro(), now.UTC().Format(time.RFC3339Nano))
		}
	}
	return token, nil
}

// reject answers a request the store did not let through: 409 when its
// token is stale, 503 when the store failed.
func (g *httpGuard) reject(w http.ResponseWriter, r *http.Request, resource string, token fence.Token, err error) {
	if errors.Is(err, ErrReplayed) {
		// A resend of the call the store last accepted: applied once,
		// and its first answer lost on the way. Not stale: no newer
		// token was accepted.
		g.debug(r, "guard: a resend of an accepted call, not run again", err, slog.String("resource", resource), slog.Int64("token", int64(token)))
		w.Header().Set(ReplayedHeader, "true")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(w).Encode(Problem{Type: ProblemReplayed, Title: "Already applied", Status: http.StatusOK,
			Detail:   "This call was accepted before with this token; it was not run again. Its first answer is not kept.",
			Resource: resource, Token: token})
		return
	}
	var stale *StaleError
	if errors.As(err, &stale) {
		g.decided(resource, token, fence.GuardReject)
		g.debug(r, "guard: stale fencing token", err, slog.String("resource", resource), slog.Int64("token", int64(token)))
		detail := "A newer fencing token was already accepted for this resource."
		if stale.Last == token {
			// Not a newer holder: this token was spent by another call (or
			// another request under this call id), and is not accepted twice.
			detail = "This fencing token was already used for another call on this resource; it is accepted once."
		}
		writeProblem(w, Problem{Type: ProblemStale, Title: "Stale fencing token", Status: http.StatusConflict,
			Detail: detail, Resource: resource, Token: token, Last: stale.Last})
		return
	}
	g.storeFailed(r, resource, token, err)
	switch {
	case errors.Is(err, ErrStoreLost):
		writeProblem(w, Problem{Type: ProblemStoreLost, Title: "Fencing token store lost its state", Status: http.StatusServiceUnavailable,
			Detail: "The fencing token was issued before the token store's state began. Acquire a new lease and try again.", Resource: resource, Token: token})
		return
	case errors.Is(err, fence.ErrNotReplicated):
		writeProblem(w, Problem{Type: ProblemNotReplicated, Title: "Fencing token not replicated", Status: http.StatusServiceUnavailable,
			Detail: "The fencing token store could not confirm the token on its replicas; the request was not run. Acquire a new lease and try again.", Resource: resource, Token: token})
		return
	}
	writeProblem(w, Problem{Type: ProblemStore, Title: "Fencing token store unavailable", Status: http.StatusServiceUnavailable,
		Detail: "The server could not check the fencing token. Try again later.", Resource: resource, Token: token})
}

// admittedBefore answers Gate's resend of a call it admitted before: the
// token was spent at admission and the handler's outcome is not known here
// (it may have failed, crashed, or still be running), so the answer is not
// a 2xx, which a caller would read as done.
func (g *httpGuard) admittedBefore(w http.ResponseWriter, r *http.Request, resource string, token fence.Token, err error) {
	g.debug(r, "guard: a resend of an admitted call, not run again", err, slog.String("resource", resource), slog.Int64("token", int64(token)))
	w.Header().Set(ReplayedHeader, "admitted")
	writeProblem(w, Problem{Type: ProblemAdmitted, Title: "Admitted before, outcome unknown", Status: http.StatusConflict,
		Detail:   "This call was admitted before with this token and was not run again. Whether it succeeded is not known here: read the resource's state.",
		Resource: resource, Token: token})
}

// decided tells the Observer, if any, of a decision on token.
func (g *httpGuard) decided(resource string, token fence.Token, d fence.GuardDecision) {
	if g.obs != nil {
		g.obs.GuardDecided(fence.GuardEvent{Resource: resource, Token: token, Decision: d})
	}
}

func (g *httpGuard) storeFailed(r *http.Request, resource string, token fence.Token, err error) {
	g.log.LogAttrs(r.Context(), slog.LevelError, "guard: fencing token store failed",
		slog.String("resource", resource), slog.Int64("token", int64(token)), slog.Any("error", err),
		slog.String("method", r.Method), slog.String("path", r.URL.Path))
}

func (g *httpGuard) debug(r *http.Request, msg string, err error, attrs ...slog.Attr) {
	attrs = append(attrs, slog.Any("error", err), slog.String("method", r.Method), slog.String("path", r.URL.Path))
	g.log.LogAttrs(r.Context(), slog.LevelDebug, msg, attrs...)
}

func writeProblem(w http.ResponseWriter, p Problem) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// Why a handler run by Middleware failed the store's fn, and a store that
// returned nil without running it (a Store that breaks its contract).
var (
	errHandlerStatus = errors.New("guard: the handler answered with a status other than 2xx or 3xx, or with 307 or 308")
	errPanicked      = errors.New("guard: the handler panicked")
	errNotRun        = errors.New("guard: the store returned nil without running the handler")
)

// only reports whether err is target, alone or joined with nothing else:
// whether the store added an error of its own (a failed rollback, say).
func only(err, target error) bool {
	if err == target {
		return true
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return false
	}
	for _, e := range joined.Unwrap() {
		if !only(e, target) {
			return false
		}
	}
	return true
}

type recovered struct {
	did   bool
	value any
}

// serve runs next, failing when it answers other than 2xx or 3xx, or 307
// or 308, and recovering a panic into p, so that the store rolls back
// before the panic goes on.
func serve(next http.Handler, w *responseBuffer, r *http.Request, p *recovered) (err error) {
	defer func() {
		if v := recover(); v != nil {
			p.did, p.value = true, v
			err = errPanicked
		}
	}()
	next.ServeHTTP(w, r)
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.status < 200 || w.status > 399 || w.status == http.StatusTemporaryRedirect || w.status == http.StatusPermanentRedirect {
		// 307 and 308 ask the client to send the same request, token
		// and all, elsewhere: nothing was done here, and a committed
		// token would make that request stale.
		return errHandlerStatus
	}
	return nil
}

// responseBuffer holds a handler's response until the store has decided.
// It offers no Flush, Hijack or Unwrap, so nothing reaches the client
// early.
type responseBuffer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *responseBuffer) Header() http.Header { return b.header }

func (b *responseBuffer) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does
	}
	if b.status != 0 || code < 200 {
		return // informational answers are dropped; they would reach the client before the commit
	}
	b.status = code
}

func (b *responseBuffer) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.WriteHeader(http.StatusOK)
	}
	return b.body.Write(p)
}

func (b *responseBuffer) sendTo(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range b.header {
		h[k] = v
	}
	w.WriteHeader(b.status)
	_, _ = w.Write(b.body.Bytes())
}

// Transport is an http.RoundTripper that attaches a lease's token and
// resource to every request. The server uses the resource header only if
// it opts in with ResourceFromHeader. Without a Lease it sends nothing and
// returns an error matching fence.ErrInvalidOption.
//
// It refuses to send once the lease has ended, returning the lease's Err,
// also when the lease ends while the request waits for a connection or,
// over HTTP/2, for a stream on one: it watches the lease until the
// request's headers are written (again at each connection it gets,
// net/http's own resend included), and checks it itself at each such
// connection and again as the headers are written: the lease's Context
// whenever net/http asks the request's context whether it is done, which
// it does last just before an HTTP/2 stream's headers are encoded (not the
// lease's Err there, which may tell the lease's Observer while net/http
// holds the connection's locks), and the lease's Err at an HTTP/1
// request's first header; not only when the cancel that the end of the
// lease's Context starts in its own goroutine has run. A Base that runs
// attempts of one request side by side may have one of them sent as the
// lease ends. A request whose headers are written is not cancelled, and
// a holder that paused before noticing is stopped by the server's check
// instead. net/http writes an HTTP/1 request on the connection it got
// whatever the request's context says, so Transport closes that connection
// before the first header: at most a request line longer than net/http's
// write buffer (4 KB) leaves, with no header and no token. With a Base
// that reports no connection through net/http/httptrace (an
// *http.ClientConn), the lease's end is caught only by the cancel that its
// Context's end starts in its own goroutine, which may come after the
// write has begun. It follows a
// redirect only on the first request's origin (scheme, host and port): a
// request that http.Client redirects to another origin is not sent, and
// Do's error matches ErrCrossOrigin.
//
// A redirect that http.Client follows is part of the call it follows: the
// follow-up (the GET after a 301, 302 or 303; the request resent, body
// and all, after a 307 or 308) goes out with that call's token and call
// id, and with the ids the stores recorded the call under, if any did
// (the RecordedCallHeader list, all of it, one id for each fenced layer
// that answered: Gate's and Middleware's behind it; taken from the
// redirect's answer, never from the caller's request; nothing is taken
// from a list that holds more than 4 ids, an empty one or an invalid
// one). After a fenced POST that Middleware applied and
// answered 303, a page fenced on the same resource answers the follow-up
// as a replay of the applied call (200, Fence-Replayed: true, a ProblemReplayed body, the
// page's handler not run; behind Gate: 409, Fence-Replayed: admitted):
// the caller learns that its call was applied, not that it was refused. A
// page fenced on another resource runs it as that call (the token is new
// there), and a page that is not fenced serves it. A request that a proxy
// answered 307 without running anything is run once, under the first call
// id. Middleware and Gate take the recorded id only on a GET or HEAD: a
// write resent after a 307 or 308 from Gate's admitted handler is a call
// of its own (stale on the same resource). The store keeps only the last call: if a newer token was accepted
// on the resource between the write and the follow-up, the follow-up is
// answered 409 stale (its Problem's last_accepted_token the newer one),
// and once the lease has ended the follow-up is not sent (Do's error
// matches the lease's), though the write was applied. To get the
// redirect's answer itself (its Location, the page's content from a
// request of its own), set the Client's CheckRedirect to return
// http.ErrUseLastResponse. Transport finds the call through
// req.Response.Request, the request it sent, which it sets on its answers
// where Base leaves it nil. It takes for a follow-up only the request that
// http.Client builds for the redirect, to its Location with the method
// http.Client chooses: one that CheckRedirect sends elsewhere, or a request
// reused from an earlier answer's Request (which keeps its Response) for
// other work, is a call of its own.
//
// Every request carries a call id (CallHeader, Fence-Call): the caller's own
// if the request already has one Fence-Call header (an invalid one is not
// sent, and the error matches ErrInvalidCall); else, on a redirect's
// follow-up, the call id of the request it follows; else one derived from
// its Idempotency-Key (or X-Idempotency-Key) header, so that the caller's
// own resends of that operation under the same lease are the same call;
// else a random one (NewCall) for each RoundTrip. net/http's Transport sends a
// request again by itself when a kept-alive connection closes before the
// answer, if the method is idempotent or an Idempotency-Key header is set,
// with the same token and the same call id: a store that had accepted the
// call (applied the write) finds the resend to be that call, does not apply
// it again, and Middleware answers 200 with Fence-Replayed: true (the first
// answer is not kept), not 409. To have its own resends of one piece of work
// (after an error of unknown outcome, under the same lease) found the same
// way, a caller sets Fence-Call or an Idempotency-Key, once per piece of
// work. net/http's own resend is refused once the lease has ended, as a
// first send is: it goes out on a new connection, where the lease is
// checked.
type Transport struct {
	Base     http.RoundTripper // nil means http.DefaultTransport
	Lease    fence.Lease       // the lease whose token is sent
	Resource string            // default: the lease's name
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.Lease == nil {
		// A Transport without its Lease panicked here, inside the
		// caller's http.Client.Do; sending without a token would be no
		// better.
		return refuse(req, fmt.Errorf("guard: not sending %s %s: %w: Transport has no Lease", req.Method, req.URL, fence.ErrInvalidOption))
	}
	if err := t.Lease.Err(); err != nil {
		return refuse(req, fmt.Errorf("guard: not sending %s %s: %w", req.Method, req.URL, err))
	}
	if first := firstRequest(req); first != req && origin(first.URL) != origin(req.URL) {
		// http.Client following a redirect (307 and 308 resend the body):
		// the token, and the holder's write, would go to a server the
		// caller did not choose.
		return refuse(req, fmt.Errorf("guard: not sending %s %s, redirected from %s: %w", req.Method, req.URL, first.URL, ErrCrossOrigin))
	}
	if prev := followedToken(req); prev != 0 && prev != t.Lease.Token() {
		return refuse(req, fmt.Errorf("guard: not sending %s %s, the follow-up of a call sent with token %d under a lease with token %d: %w",
			req.Method, req.URL, prev, t.Lease.Token(), ErrOtherLease))
	}
	call, recorded := followed(req)
	switch v := req.Header.Values(CallHeader); len(v) {
	case 0:
		if call == "" {
			call = callOf(req.Header)
		}
	case 1:
		if call = v[0]; call == "" || checkCall(call) != nil {
			return refuse(req, fmt.Errorf("guard: not sending %s %s: %w: %q", req.Method, req.URL, ErrInvalidCall, call))
		}
	default:
		return refuse(req, fmt.Errorf("guard: not sending %s %s: %w: %d %s headers", req.Method, req.URL, ErrInvalidCall, len(v), CallHeader))
	}
	resource := t.Resource
	if resource == "" {
		resource = t.Lease.Name()
	}
	// The request may wait for a connection (a slow dial, a full pool)
	// while the lease ends: cancel it then, until it has its connection.
	// From there on it is being sent, and cancelling would only lose the
	// answer.
	method, target := req.Method, req.URL.String()
	ended := func() error {
		return fmt.Errorf("guard: not sending %s %s: %w", method, target, leaseEnded(t.Lease))
	}
	parent := req.Context()
	ctx, cancel := context.WithCancelCause(parent)
	lc := t.Lease.Context()
	watch := &leaseCheck{Context: ctx, lc: lc, end: func() { cancel(ended()) }}
	var (
		armMu     sync.Mutex
		stopAfter = func() bool { return true }
		armed     bool // stopAfter's AfterFunc is registered
	)
	// arm (re)starts the watch: at RoundTrip, and at each connection the
	// request gets, net/http's own resend on an HTTP/2 connection (a
	// stream the server refused) included, and after a Base that wrote the
	// request once already (httputil.DumpRequestOut with its context).
	arm := func() {
		armMu.Lock()
		defer armMu.Unlock()
		watch.stopped.Store(false)
		if lc != nil && !armed {
			stopAfter, armed = context.AfterFunc(lc, watch.end), true
		}
	}
	arm()
	stop := func() {
		armMu.Lock()
		defer armMu.Unlock()
		watch.stopped.Store(true)
		stopAfter()
		armed = false
	}
	req = req.Clone(httptrace.WithClientTrace(watch, refuseEnded(lc, t.Lease, arm, stop, watch.end)))
	if getBody := req.GetBody; getBody != nil {
		// net/http rewinds the body only to send the request again on a
		// new connection, after WroteHeaders stopped the lease's watch:
		// not once the lease ended, and no dial for the check at the new
		// connection to refuse (TestTransportResendAfterLeaseEnded).
		req.GetBody = func() (io.ReadCloser, error) {
			if t.Lease.Err() != nil {
				return nil, ended()
			}
			return getBody()
		}
	}
	req.Header.Set(TokenHeader, fmt.Sprint(int64(t.Lease.Token())))
	req.Header.Set(ResourceHeader, resource)
	// The clone, call id and all, is what net/http sends again by itself
	// on a new connection: the server finds its resend the same call.
	req.Header.Set(CallHeader, call)
	// Only the answer a redirect follows names a recorded call: a
	// caller's own header would have a new call taken for one applied.
	// Under any spelling of its name: net/http sends a key set on the map
	// as it is ("fence-recorded-call"), and the server reads it as this
	// header (TestRecordedCallNonCanonicalNotForwarded).
	for k := range req.Header {
		if len(k) == len(RecordedCallHeader) && strings.EqualFold(k, RecordedCallHeader) {
			delete(req.Header, k)
		}
	}
	if len(recorded) > 0 {
		req.Header[RecordedCallHeader] = recorded
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(req)
	stop()
	if err != nil {
		if ctx.Err() != nil && parent.Err() == nil && !errors.Is(err, context.Cause(ctx)) {
			err = fmt.Errorf("%w (%w)", context.Cause(ctx), err) // cancelled here: the lease ended
		}
		cancel(nil)
		return nil, err
	}
	if resp.Request == nil {
		// http.Client does not fill it in, and a redirect's next request
		// finds the first one (its origin) through it.
		resp.Request = req
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// Its Body is the connection, an io.ReadWriteCloser: left as it
		// is, and ctx is left to end with the caller's.
		return resp, nil
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// leaseCheck is a request's context that, until stopped, looks at the
// lease's Context (lc) itself whenever net/http asks whether the request is
// done (Done, Err), and cancels the request (end) if it has ended: the
// cancel that lc's end starts runs in a goroutine of its own, and an
// HTTP/2 stream that gets its slot before it runs would pass net/http's
// last look at its context, just before its headers are encoded
// (TestTransportH2StreamWaitsForSlotAsLeaseEnds). It reads lc, not the
// lease's Err: Err may find the lease's end and tell its Observer, on this
// goroutine, and net/http asks there with the connection's write lock held
// (TestTransportObserverRunsInsideHTTP2Write).
type leaseCheck struct {
	context.Context
	lc      context.Context // nil: the lease has none
	end     func()
	stopped atomic.Bool // the headers are written: the request is not cancelled any more
}

func (c *leaseCheck) Done() <-chan struct{} {
	if c.lc != nil && !c.stopped.Load() && c.lc.Err() != nil {
		c.end()
	}
	return c.Context.Done()
}

func (c *leaseCheck) Err() error {
	c.Done()
	return c.Context.Err()
}

// refuseEnded returns the trace that stops a request from going out once
// lease has ended, lc being its context (nil if none). At each connection
// the request gets (a first one, then a new one for net/http's own resend)
// it checks the lease itself: watch, the cancel that lc's end starts in its
// own goroutine, may not have run yet (a CI run: the dial completed first).
// watch is stopped only once the request's headers are written (an HTTP/2
// stream may wait for a slot after GotConn; a Base such as *http.ClientConn
// reports no GotConn). If the lease has ended it cancels the
// request. An HTTP/2 stream then sends nothing; but net/http writes an
// HTTP/1 request on the connection it got whatever its context says, so
// when the request's first header is written, into a buffer not yet
// flushed, with the lease ended (at GotConn or since), the connection is
// closed and the write fails with nothing sent (but a request line longer
// than the buffer, which net/http writes through).
func refuseEnded(lc context.Context, lease fence.Lease, arm, watch, cancel func()) *httptrace.ClientTrace {
	ended := func() bool { return lease.Err() != nil || lc != nil && lc.Err() != nil }
	var mu sync.Mutex
	var conns []net.Conn // the connections got since the last first header field
	return &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			arm()
			mu.Lock()
			conns = append(conns, info.Conn)
			mu.Unlock()
			if ended() {
				cancel()
			}
		},
		WroteHeaderField: func(key string, _ []string) {
			mu.Lock()
			got := conns
			conns = nil
			mu.Unlock()
			// The first field after a connection: over HTTP/2 a pseudo-
			// header (":authority" first), written only if the stream's
			// context was not cancelled (leaseCheck looks at the lease's
			// Context then) on a connection shared with other streams:
			// not closed. An HTTP/1 request is written whatever its
			// context says: the lease, which may have ended since GotConn,
			// is looked at again at its first field, still in net/http's
			// buffer. Every connection got since the last first field is
			// this request's (a Base that runs attempts side by side gets
			// several).
			if len(got) > 0 && !strings.HasPrefix(key, ":") && ended() {
				cancel()
				for _, c := range got {
					_ = c.Close()
				}
			}
		},
		// The request is being sent: from here the lease's end no longer
		// cancels it (an HTTP/2 stream may wait for a slot after GotConn,
		// and a Base may report no GotConn at all).
		WroteHeaders: watch,
	}
}

// refuse closes req's body, as a RoundTripper must even when it sends
// nothing, and returns err.
func refuse(req *http.Request, err error) (*http.Response, error) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
	return nil, err
}

// callOf returns the call id of a request without a Fence-Call header: one
// derived from its Idempotency-Key (or X-Idempotency-Key), which names one
// operation across the caller's own resends of it, else a random one.
func callOf(h http.Header) string {
	key := h.Get("Idempotency-Key")
	if key == "" {
		key = h.Get("X-Idempotency-Key")
	}
	if key == "" {
		return NewCall()
	}
	sum := sha256.Sum256([]byte(key))
	return "idem-" + hex.EncodeToString(sum[:16])
}

// followed returns, for a request that http.Client makes to follow a
// redirect (req.Response is the redirect's answer), the call id that the
// request it follows was sent with (the header Transport set on its clone,
// which net/http's Transport returns as Response.Request, and RoundTrip
// sets there where a Base did not), and the ids stores recorded the call
// under: the list the redirect's answer carries, if it is a valid one
// (see recordedCalls), else the one the request it follows carried
// (through a page that is not fenced). Both are empty for a request that
// follows none.
func followed(req *http.Request) (call string, recorded []string) {
	if !isFollowUp(req) {
		return "", nil
	}
	prev := req.Response.Request
	call = oneCall(prev.Header, CallHeader)
	if recorded, _ = recordedCalls(req.Response.Header); recorded == nil {
		recorded, _ = recordedCalls(prev.Header)
	}
	return call, recorded
}

// followedToken is the token that the call req follows was sent with (see
// isFollowUp), or 0 if req follows none, or that call carried no valid
// one (TestFollowUpUnderAnotherLeaseRefused).
func followedToken(req *http.Request) fence.Token {
	if !isFollowUp(req) {
		return 0
	}
	v := req.Response.Request.Header.Values(TokenHeader)
	if len(v) != 1 {
		return 0
	}
	n, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return fence.Token(n)
}

// isFollowUp reports whether req is the request that http.Client makes to
// follow req.Response: to its Location, with the method http.Client
// chooses. A request reused from an earlier Do (resp.Request keeps its
// Response) for other work is not, and is a call of its own
// (TestReusedFollowUpIsNotTheCall).
func isFollowUp(req *http.Request) bool {
	resp := req.Response
	if resp == nil || resp.Request == nil {
		return false
	}
	u, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
	if err != nil || u.String() != req.URL.String() {
		return false
	}
	want := methodOf(resp.Request)
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther:
		if want != http.MethodHead {
			want = http.MethodGet
		}
	case http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
	default:
		return false
	}
	return methodOf(req) == want
}

func methodOf(r *http.Request) string {
	if r.Method == "" {
		return http.MethodGet
	}
	return r.Method
}

// oneCall returns h's one valid call id under name, or "".
func oneCall(h http.Header, name string) string {
	v, err := headerCall(h, name)
	if err != nil {
		return ""
	}
	return v
}

// leaseEnded returns why lease ended, or fence.ErrLeaseLost if it does not
// say yet.
func leaseEnded(lease fence.Lease) error {
	if err := lease.Err(); err != nil {
		return err
	}
	return fence.ErrLeaseLost
}

// cancelOnClose ends a request's context once its answer's body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

// firstRequest returns the request that http.Client sent first, of which
// req is a redirect (or req itself).
func firstRequest(req *http.Request) *http.Request {
	for req.Response != nil && req.Response.Request != nil {
		req = req.Response.Request
	}
	return req
}

// origin returns u's scheme, host and port, the port made explicit.
func origin(u *url.URL) string {
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if port == "" {
		switch scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}
