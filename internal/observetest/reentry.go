package observetest

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// Reentry is an Observer, and through Handler a Logger's handler, that
// records every end of a lease and, at the first end it is told of (a
// LeaseEnded, or a "lease lost" record), calls the lease set with Set back:
// Extend, Release twice, Err, Context and Done, as a "lost: release and
// clean up" callback does. Calls returns what they returned. It is safe for
// concurrent use.
type Reentry struct {
	fence.NopObserver
	mu    sync.Mutex
	ends  []fence.LeaseEvent
	lease fence.Lease
	calls chan ReentryCalls
}

// ReentryCalls is what Reentry's calls into the lease returned.
type ReentryCalls struct {
	Cause             fence.LeaseCause // of the end reported ("" when told by the Logger)
	Extend            error
	Release, Again    error // the first and the second Release
	Err, ContextCause error
	DoneClosed        bool
}

// NewReentry returns a Reentry with no lease to call back yet.
func NewReentry() *Reentry { return &Reentry{calls: make(chan ReentryCalls, 1)} }

// Set makes lease the one called back at the next end.
func (r *Reentry) Set(lease fence.Lease) { r.mu.Lock(); r.lease = lease; r.mu.Unlock() }

// LeaseEnded records e and calls the lease back.
func (r *Reentry) LeaseEnded(e fence.LeaseEvent) {
	r.mu.Lock()
	r.ends = append(r.ends, e)
	r.mu.Unlock()
	r.call(e.Cause)
}

// Ends returns the ends recorded so far, in order.
func (r *Reentry) Ends() []fence.LeaseEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]fence.LeaseEvent(nil), r.ends...)
}

// Handler returns a slog.Handler that calls the lease back at a record
// whose message says "lease lost".
func (r *Reentry) Handler() slog.Handler { return reentryHandler{r} }

// Calls waits up to limit for the callback's calls to return, and fails t
// with every goroutine's stack if they have not (a deadlock).
func (r *Reentry) Calls(t testing.TB, limit time.Duration) ReentryCalls {
	t.Helper()
	select {
	case c := <-r.calls:
		return c
	case <-time.After(limit):
		t.Fatalf("the callback's calls into the lease did not return within %v (deadlock?); goroutines:\n%s", limit, Stacks())
		return ReentryCalls{}
	}
}

func (r *Reentry) call(cause fence.LeaseCause) {
	r.mu.Lock()
	ls := r.lease
	r.lease = nil
	r.mu.Unlock()
	if ls == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := ReentryCalls{Cause: cause}
	c.Extend = ls.Extend(ctx, time.Minute)
	c.Release = ls.Release(ctx)
	c.Again = ls.Release(ctx)
	c.Err = ls.Err()
	c.ContextCause = context.Cause(ls.Context())
	select {
	case <-ls.Done():
		c.DoneClosed = true
	default:
	}
	r.calls <- c
}

type reentryHandler struct{ r *Reentry }

func (h reentryHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h reentryHandler) Handle(_ context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, "lease lost") {
		h.r.call("")
	}
	return nil
}
func (h reentryHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h reentryHandler) WithGroup(string) slog.Handler      { return h }

// Stacks returns every goroutine's stack, for a test that found a
// deadlock.
func Stacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}
