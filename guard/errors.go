package guard

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/fencekit/fence"
)

// Errors returned by the guard; match them with errors.Is.
var (
	// ErrStale means a token was not greater than the last token accepted
	// for the resource; nothing was written. See StaleError.
	ErrStale = errors.New("guard: stale token")

	// ErrNoRow means the row to update does not exist.
	ErrNoRow = errors.New("guard: no such row")

	// ErrInvalidToken means a token was zero, negative, malformed or out of
	// range; nothing was sent to the store.
	ErrInvalidToken = errors.New("guard: invalid token")

	// ErrInvalidResource means a resource name was empty, too long, or held
	// control characters or braces (see fence.ValidateName).
	ErrInvalidResource = errors.New("guard: invalid resource")

	// ErrDuplicate means an idempotency key was already recorded.
	ErrDuplicate = errors.New("guard: duplicate idempotency key")

	// ErrInvalidKey means an idempotency key was empty, longer than 512
	// bytes, not valid UTF-8, or held a NUL byte; nothing was sent to the
	// database.
	ErrInvalidKey = errors.New("guard: invalid idempotency key")

	// ErrConflict means an optimistic version check failed: the row's
	// version was not the one expected. See ConflictError.
	ErrConflict = errors.New("guard: version conflict")

	// ErrInvalidTable means a Table's identifiers are not plain SQL names,
	// or the set clause given to Table.Update or Table.UpdateVersion holds
	// a comment or a ';' that would cut off its WHERE clause. Nothing was
	// sent to the database.
	// CreateTables returns it too when a guard table the connection uses
	// is not shared and durable: a TEMP (on PostgreSQL or SQLite) or an UNLOGGED
	// fence_tokens or fence_idempotency, or one with an UNLOGGED
	// partition (having created nothing, unless the search_path made
	// the table it created TEMP).
	ErrInvalidTable = errors.New("guard: invalid table description")

	// ErrNestedTx means Tx was called with a context of SQLStore's fenced
	// transaction (a handler behind Middleware) on that store's own
	// database: the new transaction would wait for the one it runs in
	// (on the same resource, or on SQLite for any), until ctx ended.
	// Nothing was sent to the database; fence another resource with Fence
	// on TxFrom's transaction instead.
	ErrNestedTx = errors.New("guard: Tx inside SQLStore's transaction on the same database")

	// ErrCrossOrigin means Transport refused to send a redirected request
	// to an origin (scheme, host and port) other than the first request's:
	// it would have carried the lease's token, and the request's body, to
	// a server the caller did not choose. Nothing was sent there.
	ErrCrossOrigin = errors.New("guard: redirect to another origin")

	// ErrOtherLease means Transport refused to send a redirect's follow-up
	// because the call it follows went out with another token than its
	// lease's (the caller swapped Transports, or their Lease, between the
	// hops): the follow-up belongs to that call, and under this token it
	// would run as a call of its own and spend the token that the new
	// holder's work needs. Nothing was sent.
	ErrOtherLease = errors.New("guard: redirect followed under another lease")

	// ErrReplayed means a call was sent again with the token and the call
	// id (see WithCall) of the call the store last accepted for the
	// resource: a resend of a call that was applied. The store did
	// nothing this time (the work is not done twice); it is not
	// ErrStale, since no newer token was accepted. Middleware and Gate
	// answer it 200 with a Fence-Replayed header (see Middleware).
	ErrReplayed = errors.New("guard: call already accepted (a resend)")

	// ErrInvalidCall means a call id (see WithCall) was longer than 128
	// bytes or held bytes other than ASCII letters,
	// digits, '-', '_', '.' or ':'; nothing was sent to the store.
	ErrInvalidCall = errors.New("guard: invalid call id")

	// ErrStoreLost means a store that keeps a floor under its records
	// (redisstore.Store with ClockTokens) had no record of the resource
	// and the token was not above the floor: the token was issued before
	// the store's state began, and the store may have lost a newer token
	// of the resource (a Redis restarted without persistence, flushed).
	// Nothing was recorded. A new lease's token, issued after the floor,
	// is accepted. See StoreLostError.
	ErrStoreLost = errors.New("guard: token issued before the store's state began")
)

// StaleError reports a rejected token and the last one accepted. It matches
// ErrStale.
type StaleError struct {
	Resource string      // the resource the token was presented for
	Token    fence.Token // the rejected token
	Last     fence.Token // the last token accepted for Resource when it was rejected
}

// Error describes the failure with its figures.
func (e *StaleError) Error() string {
	return fmt.Sprintf("guard: stale token %d for %s: token %d already accepted", e.Token, e.Resource, e.Last)
}

// Is reports whether target is ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// StoreLostError reports a token refused by a store's floor (see
// ErrStoreLost). It matches ErrStoreLost and also ErrStale: the token may
// be stale, and a caller that gives up on ErrStale gives up safely; unlike
// after a StaleError, though, a holder that acquires a new lease gets a
// token the store accepts. Middleware and Gate answer it 503 with a Problem
// of type ProblemStoreLost, not 409.
type StoreLostError struct {
	Resource string      // the resource the token was presented for
	Token    fence.Token // the refused token
	Floor    fence.Token // the store's floor: tokens of resources it has no record of must be above it
}

// Error describes the failure with its figures.
func (e *StoreLostError) Error() string {
	return fmt.Sprintf("guard: token %d for %s refused: the store has no record of the resource, and the token is not above its floor %d (the store's state began after the token was issued; a new lease's token is accepted)", e.Token, e.Resource, e.Floor)
}

// Is reports whether target is ErrStoreLost or ErrStale.
func (e *StoreLostError) Is(target error) bool { return target == ErrStoreLost || target == ErrStale }

// ConflictError reports a failed version check. It matches ErrConflict.
type ConflictError struct {
	Key      any   // the row's key, as passed to UpdateVersion
	Expected int64 // the version the caller read
	Current  int64 // the version the row had
}

// Error describes the failure with its figures.
func (e *ConflictError) Error() string {
	return fmt.Sprintf("guard: version conflict on %v: expected %d, row has %d", e.Key, e.Expected, e.Current)
}

// Is reports whether target is ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// ParseToken parses a token as sent in a header: decimal digits only, no
// sign, no leading zeros, greater than zero, at most the int64 maximum. The
// error matches ErrInvalidToken.
func ParseToken(s string) (fence.Token, error) {
	if s == "" {
		return 0, fmt.Errorf("%w: empty", ErrInvalidToken)
	}
	if len(s) > len("9223372036854775807") {
		return 0, fmt.Errorf("%w: %d bytes, longer than any int64", ErrInvalidToken, len(s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%w: %q is not a decimal number", ErrInvalidToken, s)
		}
	}
	if s[0] == '0' {
		return 0, fmt.Errorf("%w: %q must be greater than zero, without leading zeros", ErrInvalidToken, s)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q is out of range", ErrInvalidToken, s)
	}
	return fence.Token(n), nil
}

// checkToken rejects tokens of zero or less.
func checkToken(t fence.Token) error {
	if t <= 0 {
		return fmt.Errorf("%w: %d must be greater than zero", ErrInvalidToken, t)
	}
	return nil
}

// checkResource validates a resource name with fence's lock-name rules.
func checkResource(resource string) error {
	if err := fence.ValidateName(resource); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidResource, err)
	}
	return nil
}
