// Package observetest records what a fence.Observer and a slog.Handler are
// told, for the tests of the backends and guards that report to them. It
// imports no backend, so that their internal tests can use it too.
package observetest

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// Recorder is a fence.Observer that keeps every event, for the tests of the
// backends that report to one. It is safe for concurrent use.
type Recorder struct {
	mu       sync.Mutex
	acquires []fence.AcquireEvent
	ends     []fence.LeaseEvent
	refusals []fence.ReplicaSyncEvent
	guards   []fence.GuardEvent
}

var _ fence.Observer = (*Recorder)(nil)

// AcquireDone keeps e.
func (r *Recorder) AcquireDone(e fence.AcquireEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acquires = append(r.acquires, e)
}

// LeaseEnded keeps e.
func (r *Recorder) LeaseEnded(e fence.LeaseEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ends = append(r.ends, e)
}

// ReplicaSyncRefused keeps e.
func (r *Recorder) ReplicaSyncRefused(e fence.ReplicaSyncEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refusals = append(r.refusals, e)
}

// GuardDecided keeps e.
func (r *Recorder) GuardDecided(e fence.GuardEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.guards = append(r.guards, e)
}

// Acquires returns the AcquireEvents so far, in order.
func (r *Recorder) Acquires() []fence.AcquireEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.acquires)
}

// Ends returns the LeaseEvents so far, in order.
func (r *Recorder) Ends() []fence.LeaseEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ends)
}

// Refusals returns the ReplicaSyncEvents so far, in order.
func (r *Recorder) Refusals() []fence.ReplicaSyncEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.refusals)
}

// Results counts the acquisitions so far by result.
func (r *Recorder) Results() map[fence.AcquireResult]int {
	m := map[fence.AcquireResult]int{}
	for _, e := range r.Acquires() {
		m[e.Result]++
	}
	return m
}

// Causes counts the ended leases so far by cause.
func (r *Recorder) Causes() map[fence.LeaseCause]int {
	m := map[fence.LeaseCause]int{}
	for _, e := range r.Ends() {
		m[e.Cause]++
	}
	return m
}

// WaitEnds waits until n leases have ended, failing t after limit, and
// returns their events: a lease's end is reported just after its Done
// closes.
func (r *Recorder) WaitEnds(t testing.TB, n int, limit time.Duration) []fence.LeaseEvent {
	t.Helper()
	end := time.Now().Add(limit)
	for {
		if ends := r.Ends(); len(ends) >= n {
			return ends
		}
		if time.Now().After(end) {
			t.Fatalf("%d lease ends after %v, want %d: %+v", len(r.Ends()), limit, n, r.Ends())
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// Logs is a slog.Handler that keeps every record, its attributes flattened
// to strings, with "msg" and "level" among them.
type Logs struct {
	mu    sync.Mutex
	lines []map[string]string
}

// Enabled reports true: Logs keeps every level.
func (h *Logs) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs returns h: the tests' loggers carry no attributes of their own.
func (h *Logs) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup returns h.
func (h *Logs) WithGroup(string) slog.Handler { return h }

// Handle keeps r.
func (h *Logs) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message, "level": r.Level.String()}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, m)
	return nil
}

// Find returns the lines whose message contains msg.
func (h *Logs) Find(msg string) []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, m := range h.lines {
		if strings.Contains(m["msg"], msg) {
			out = append(out, m)
		}
	}
	return out
}

// Len returns how many lines were logged.
func (h *Logs) Len() int { h.mu.Lock(); defer h.mu.Unlock(); return len(h.lines) }

// All returns every line.
func (h *Logs) All() []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lines)
}

// Releaser is a slog.Handler that, on the first record whose message
// contains Msg, releases the lease set with Set, from the handler (on the
// goroutine that logs), within Timeout (20 s if zero), and sends what Release
// returned on Done. It tests that a handler may call Release on a watchdog's
// warning: the watchdog must not be what that Release waits for.
type Releaser struct {
	Msg     string
	Done    chan error    // buffered by NewReleaser
	Timeout time.Duration // of the handler's Release; 20 s if zero

	mu       sync.Mutex
	lease    fence.Lease // to release, until the handler takes it
	released fence.Lease // what the handler took
	called   bool
}

// NewReleaser returns a Releaser for records containing msg.
func NewReleaser(msg string) *Releaser { return &Releaser{Msg: msg, Done: make(chan error, 1)} }

// Set arms the handler with the lease to release.
func (h *Releaser) Set(lease fence.Lease) { h.mu.Lock(); h.lease = lease; h.mu.Unlock() }

// Called reports whether the handler has taken the lease to release it.
func (h *Releaser) Called() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.called }

// Enabled reports true.
func (h *Releaser) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs returns h.
func (h *Releaser) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup returns h.
func (h *Releaser) WithGroup(string) slog.Handler { return h }

// Handle releases the lease on the first record matching Msg.
func (h *Releaser) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, h.Msg) {
		return nil
	}
	h.mu.Lock()
	lease := h.lease
	h.lease = nil
	if lease != nil {
		h.called, h.released = true, lease
	}
	h.mu.Unlock()
	if lease == nil {
		return nil
	}
	timeout := h.Timeout
	if timeout == 0 {
		timeout = 20 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	h.Done <- lease.Release(ctx)
	return nil
}

// AwaitEnded is Await, then checks that the lease the handler released has
// ended and closed Done (within 5 s), and logs what Release returned.
func (h *Releaser) AwaitEnded(t testing.TB, limit time.Duration) {
	t.Helper()
	err := h.Await(t, limit)
	t.Logf("Release from the handler: %v", err)
	h.mu.Lock()
	lease := h.released
	h.mu.Unlock()
	if lease.Err() == nil {
		t.Fatal("the lease is held after Release from the handler")
	}
	select {
	case <-lease.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after Release")
	}
}

// Await waits up to limit for the handler's Release to return, and fails
// t with every goroutine's stack if it has not (a deadlock: Release waits
// for the goroutine that is in the handler).
func (h *Releaser) Await(t testing.TB, limit time.Duration) error {
	t.Helper()
	select {
	case err := <-h.Done:
		return err
	case <-time.After(limit):
		t.Fatalf("Release from the log handler did not return within %v (deadlock?); goroutines:\n%s", limit, Stacks())
		return nil
	}
}
