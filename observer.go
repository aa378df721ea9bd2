package fence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"
)

// Observer receives what lockers and guards do, for metrics and traces. A
// backend or guard given an Observer calls it synchronously, on a goroutine
// that took part in the event (the watchdog's, an expiry timer's, the
// caller's), so its methods must be safe for concurrent use and quick:
// count, record, return. A slow method holds up that goroutine: the
// watchdog's renewals of other work, a caller's Release.
//
// LeaseEnded may call the lease's methods: "on lease lost, release and
// clean up" is a natural callback. Every backend in this module reports a
// lease's end once it holds nothing those methods wait for (its locks, the
// renewal under way, the watchdog's goroutine that Release waits to end),
// so a Release called there does not wait for the callback's own caller:
// it returns the lease's conclusive result (an error matching ErrLeaseLost
// for a lost lease; for a lease that a Release ended, that Release's
// result), and Extend an error matching ErrLeaseLost (or ErrReleased).
// fencetest's Reentry subtests check it for each way a lease ends. The
// same holds for a slog.Handler of a backend's Logger told
// "lease lost" (ReportLeaseEnded logs before it calls LeaseEnded), and told
// that a watchdog's renewal (zklock: a check of the lease's node) failed:
// the watchdog logs that with no renewal under way, and a Release called
// then does not wait for it. Other methods, and other log records, must not
// call back into the lease or locker: a Release there may wait for the
// very goroutine that makes the call.
//
// A lease's end is reported once: LeaseEnded is called exactly once per
// lease that an Acquire returned, never for one it did not. AcquireDone is
// called as Acquire returns, once the lease's timers and watchdog run: a
// lease that ends at once (a short fence.TTL on a stalled machine) may be
// reported ended before its acquisition. A Release that ends the lease
// reports it before it returns; but a loss that the watchdog (or a session's watch) found just as
// Release was called is reported by the watchdog's goroutine once it is
// done, which may be after that Release returned, and after a Locker's
// Close.
//
// Observer is an interface with an embeddable no-op default, NopObserver,
// rather than a struct of function fields (httptrace.ClientTrace's way):
// an adapter is one value of its own type, holding its instruments, and
// embedding NopObserver keeps it compiling when a method is added here.
// Each method takes one event struct by value, so that fields can be added
// without changing any signature.
//
// Events carry the lock or resource name so that an observer can log or
// trace it, but an observer that labels metrics must not use it as a label
// value: names are unbounded (one per payment, say). Map them to a small set
// of classes instead (see the Prometheus adapter's Classify), or leave them
// out.
type Observer interface {
	// AcquireDone is called once per Acquire that got past input
	// validation, when it returns.
	AcquireDone(AcquireEvent)
	// LeaseEnded is called once per granted lease, when it ends.
	LeaseEnded(LeaseEvent)
	// ReplicaSyncRefused is called when too few replicas acknowledged an
	// acquisition or a renewal in time (see ErrNotReplicated).
	ReplicaSyncRefused(ReplicaSyncEvent)
	// GuardDecided is called when a guard accepts or rejects a token.
	GuardDecided(GuardEvent)
}

// NopObserver does nothing. Embed it in an Observer that handles only some
// events, so that it keeps compiling when Observer gains a method.
type NopObserver struct{}

// AcquireDone does nothing.
func (NopObserver) AcquireDone(AcquireEvent) {}

// LeaseEnded does nothing.
func (NopObserver) LeaseEnded(LeaseEvent) {}

// ReplicaSyncRefused does nothing.
func (NopObserver) ReplicaSyncRefused(ReplicaSyncEvent) {}

// GuardDecided does nothing.
func (NopObserver) GuardDecided(GuardEvent) {}

var _ Observer = NopObserver{}

// ValidateObserver returns an error matching ErrInvalidOption when obs is
// an interface holding a nil pointer (or a nil map, slice, func or chan):
// such an Observer is not nil, and the first event would panic inside
// Acquire or a lease's goroutine, far from its cause, typically the nil
// *Observer that an adapter's New returned beside an error that was
// ignored. A nil obs is valid (no Observer). Backends and guards call it
// from their constructors.
func ValidateObserver(obs Observer) error {
	if obs == nil {
		return nil
	}
	if holdsNil(obs) {
		return fmt.Errorf("%w: Observer is a nil %T (was the error of the constructor that returned it ignored?)", ErrInvalidOption, obs)
	}
	return nil
}

// holdsNil reports whether v is nil or an interface value holding a nil
// pointer, map, slice, func or chan.
func holdsNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

// AcquireResult is how an Acquire ended. Its values are fixed, fit for a
// metric label.
type AcquireResult string

// The results of Acquire.
const (
	Acquired      AcquireResult = "acquired"       // the lease was granted
	Held          AcquireResult = "held"           // another owner held the lock for the whole budget (ErrHeld)
	NotReplicated AcquireResult = "not_replicated" // too few replicas acknowledged (ErrNotReplicated)
	Cancelled     AcquireResult = "cancelled"      // the caller's context ended
	Failed        AcquireResult = "error"          // the backend failed
)

// ResultOf classifies Acquire's error: nil is Acquired; then ErrHeld,
// ErrNotReplicated, the caller's context (context.Canceled or
// DeadlineExceeded), and anything else is Failed. Backends use it so that
// they all report results alike.
func ResultOf(err error) AcquireResult {
	switch {
	case err == nil:
		return Acquired
	case errors.Is(err, ErrHeld):
		return Held
	case errors.Is(err, ErrNotReplicated):
		return NotReplicated
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Cancelled
	default:
		return Failed
	}
}

// AcquireEvent describes one Acquire call.
type AcquireEvent struct {
	Backend string        // "redis", "memory", …: fixed per backend
	Name    string        // the lock name; not a label (see Observer)
	Result  AcquireResult // how it ended
	Token   Token         // the lease's token when Result is Acquired
	Wait    time.Duration // from the call to its return
	Err     error         // Acquire's error, nil when acquired
}

// LeaseCause is why a lease ended. Its values are fixed, fit for a metric
// label.
type LeaseCause string

// The causes of a lease's end. Every cause but Released is a loss.
const (
	Released LeaseCause = "released" // Release ended it
	// LostExpired: a lease with a fixed TTL was not extended before its
	// deadline.
	LostExpired LeaseCause = "expired"
	// LostRenewFailed: a watchdog lease's renewals failed (server down,
	// too few replicas…) until its deadline passed.
	LostRenewFailed LeaseCause = "renew_failed"
	// LostRenewLate: a renewal reached the server after the lease's
	// deadline and was refused.
	LostRenewLate LeaseCause = "renew_late"
	// LostRemoved: the server no longer had the lock, or another owner
	// had it (deleted, evicted, expired there, lost in a failover).
	LostRemoved LeaseCause = "removed"
)

// LeaseEvent describes the end of a lease.
type LeaseEvent struct {
	Backend string
	Name    string // the lock name; not a label (see Observer)
	Token   Token
	Cause   LeaseCause
	Held    time.Duration // from the grant to the end
	Err     error         // the lease's Err
}

// ReplicaSyncEvent describes an acquisition or renewal that too few
// replicas acknowledged in time.
type ReplicaSyncEvent struct {
	Backend  string
	Name     string // the lock name; not a label (see Observer)
	Renewal  bool   // a renewal (or Extend), not an acquisition
	Acked    int    // replicas that acknowledged in time
	Required int    // replicas the acknowledgement rule required
}

// GuardDecision is a guard's verdict on a token.
type GuardDecision string

// The decisions of a guard.
const (
	GuardAccept GuardDecision = "accept" // the token was greater than the last accepted
	GuardReject GuardDecision = "reject" // the token was stale
)

// GuardEvent describes a guard's decision on a token.
type GuardEvent struct {
	Resource string // the fenced resource; not a label (see Observer)
	Token    Token
	Decision GuardDecision
}

// ReportAcquire reports an Acquire call that began at start and returned
// lease and err to obs as an AcquireEvent of backend. Invalid input (an
// error matching ErrInvalidName or ErrInvalidOption, returned before the
// backend was tried: not inside ErrNotAcquired) is not reported: it never
// reached the backend. A configuration refused once the backend was tried
// (ErrInvalidOption inside ErrNotAcquired: redislock's replica sync on a
// client that cannot run it, say) is reported, as Failed: every Acquire
// then fails, and the metrics must show it. Backends call it from Acquire
// when they have an Observer, holding nothing that lease's methods wait
// for.
//
// If AcquireDone panics (or calls runtime.Goexit) for a granted lease,
// ReportAcquire releases the lease, for up to 5 s, before the panic goes
// on up through Acquire: Acquire then returns no lease that its caller
// could release, and a caller that recovers must not be left with a lock
// that a watchdog renews for ever.
func ReportAcquire(obs Observer, backend, name string, start time.Time, lease Lease, err error) {
	if (errors.Is(err, ErrInvalidName) || errors.Is(err, ErrInvalidOption)) && !errors.Is(err, ErrNotAcquired) {
		return
	}
	ev := AcquireEvent{Backend: backend, Name: name, Result: ResultOf(err), Wait: time.Since(start), Err: err}
	if lease != nil {
		ev.Token = lease.Token()
		returned := false
		defer func() {
			if !returned {
				ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
				defer cancel()
				_ = lease.Release(ctx)
			}
		}()
		obs.AcquireDone(ev)
		returned = true
		return
	}
	obs.AcquireDone(ev)
}

// ReportLeaseEnded reports the end of a lease, once per lease, to log and
// obs, either of which may be nil: log gets a warning "pkg: lease lost"
// with the lock's name, token, cause and error, unless the lease was
// released (nothing is logged for a release); obs gets ev. Backends call
// it once per lease after it ended, with ctx the lease's (its values, for
// the log handler), and only once they hold nothing that the lease's
// methods wait for (see Observer): not under a lock of theirs, nor from a
// goroutine that Release waits to end.
func ReportLeaseEnded(ctx context.Context, obs Observer, log *slog.Logger, pkg string, ev LeaseEvent) {
	if log != nil && ev.Cause != Released {
		log.LogAttrs(ctx, slog.LevelWarn, pkg+": lease lost",
			slog.String("name", ev.Name), slog.Int64("token", int64(ev.Token)),
			slog.String("cause", string(ev.Cause)), slog.Any("error", ev.Err))
	}
	if obs != nil {
		obs.LeaseEnded(ev)
	}
}
