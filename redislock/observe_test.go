package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// recorder is an Observer that keeps every event.
type recorder struct {
	mu       sync.Mutex
	acquires []fence.AcquireEvent
	ends     []fence.LeaseEvent
	refusals []fence.ReplicaSyncEvent
}

func (r *recorder) AcquireDone(e fence.AcquireEvent) {
	r.mu.Lock()
	r.acquires = append(r.acquires, e)
	r.mu.Unlock()
}
func (r *recorder) LeaseEnded(e fence.LeaseEvent) {
	r.mu.Lock()
	r.ends = append(r.ends, e)
	r.mu.Unlock()
}
func (r *recorder) ReplicaSyncRefused(e fence.ReplicaSyncEvent) {
	r.mu.Lock()
	r.refusals = append(r.refusals, e)
	r.mu.Unlock()
}
func (r *recorder) GuardDecided(fence.GuardEvent) {}

func (r *recorder) endsSoFar() []fence.LeaseEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ends)
}

// records is a slog.Handler that keeps every record, with its attributes
// flattened to strings.
type records struct {
	mu    sync.Mutex
	lines []map[string]string
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *records) WithGroup(string) slog.Handler            { return h }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message, "level": r.Level.String()}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	h.mu.Lock()
	h.lines = append(h.lines, m)
	h.mu.Unlock()
	return nil
}

// find returns the lines whose message contains msg.
func (h *records) find(msg string) []map[string]string {
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

func (h *records) count() int { h.mu.Lock(); defer h.mu.Unlock(); return len(h.lines) }

// TestNothingLoggedByDefault: a Locker without a Logger logs nothing, not
// even through slog's default logger, while leases are lost, renewals fail
// and replicas refuse.
func TestNothingLoggedByDefault(t *testing.T) {
	h := &records{}
	old := slog.Default()
	slog.SetDefault(slog.New(h))
	t.Cleanup(func() { slog.SetDefault(old) })

	srv := redistest.Start(t)
	c := srv.Client(t)
	l := lockerWith(t, c, redislock.Options{WatchdogTTL: watchdogTTL,
		ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: 20 * time.Millisecond}})
	if _, err := l.Acquire(ctx(t), "refused", fence.TTL(time.Minute)); !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("Acquire with an expected replica missing: %v, want ErrNotReplicated", err)
	}
	// An Observer but no Logger: the Locker reports the lost lease's end
	// after it would have logged it.
	rec := &recorder{}
	l = lockerWith(t, c, redislock.Options{WatchdogTTL: watchdogTTL, Observer: rec})
	lease := acquire(t, l, "job")
	c.Del(ctx(t), lockKey("job"))
	<-lease.Done()
	waitFor(t, func() bool { return len(rec.endsSoFar()) == 1 })
	if n := h.count(); n != 0 {
		t.Fatalf("%d lines logged without a Logger: %v", n, h.lines)
	}
}

// TestObserverAndLogs: a lease lost because its key was deleted behind the
// holder's back, a watchdog lease whose server went away, and a refused
// acquisition reach the Observer and the Logger with name, token and cause.
func TestObserverAndLogs(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	rec, h := &recorder{}, &records{}
	// A lease time that a slow round trip on a busy machine does not eat
	// before the test deletes the key (the lease would end as
	// renew_failed instead).
	l := lockerWith(t, c, redislock.Options{WatchdogTTL: 2 * time.Second, Observer: rec, Logger: slog.New(h)})

	// Removed behind the holder's back: the watchdog's next renewal finds
	// the lock gone.
	lease := acquire(t, l, "lock:payment:1001")
	if err := c.Del(ctx(t), lockKey("lock:payment:1001")).Err(); err != nil {
		t.Fatal(err)
	}
	<-lease.Done()
	waitFor(t, func() bool { return len(rec.endsSoFar()) == 1 })
	end := rec.endsSoFar()[0]
	if end.Cause != fence.LostRemoved || end.Token != lease.Token() || end.Name != "lock:payment:1001" || end.Backend != "redis" ||
		!errors.Is(end.Err, fence.ErrLeaseLost) || end.Held <= 0 {
		t.Fatalf("LeaseEnded %+v, want removed, token %d", end, lease.Token())
	}
	waitFor(t, func() bool { return len(h.find("lease lost")) == 1 }) // logged after the event
	lost := h.find("lease lost")
	if len(lost) != 1 || lost[0]["name"] != "lock:payment:1001" || lost[0]["token"] != fmt.Sprint(lease.Token()) ||
		lost[0]["cause"] != "removed" || lost[0]["level"] != "WARN" {
		t.Fatalf("lease lost lines %v", lost)
	}

	// Released: observed, not logged.
	released := acquire(t, l, "other", fence.TTL(time.Minute))
	if err := released.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if ends := rec.endsSoFar(); len(ends) != 2 || ends[1].Cause != fence.Released || ends[1].Token != released.Token() {
		t.Fatalf("after Release, ends %+v", ends)
	}
	if n := len(h.find("lease lost")); n != 1 {
		t.Fatalf("%d lease lost lines after a Release, want still 1", n)
	}

	// Held: one try, one event.
	holder := acquire(t, l, "held", fence.TTL(time.Minute))
	if _, err := l.Acquire(ctx(t), "held"); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("second Acquire: %v", err)
	}
	rec.mu.Lock()
	results := make([]fence.AcquireResult, 0, len(rec.acquires))
	for _, a := range rec.acquires {
		results = append(results, a.Result)
	}
	last := rec.acquires[len(rec.acquires)-1]
	rec.mu.Unlock()
	if want := []fence.AcquireResult{fence.Acquired, fence.Acquired, fence.Acquired, fence.Held}; !slices.Equal(results, want) {
		t.Fatalf("acquire results %v, want %v", results, want)
	}
	if last.Name != "held" || last.Token != 0 || !errors.Is(last.Err, fence.ErrHeld) {
		t.Fatalf("held event %+v", last)
	}
	_ = holder

	// Bad input is not an acquisition.
	if _, err := l.Acquire(ctx(t), ""); !errors.Is(err, fence.ErrInvalidName) {
		t.Fatal(err)
	}
	rec.mu.Lock()
	n := len(rec.acquires)
	rec.mu.Unlock()
	if n != 4 {
		t.Fatalf("%d acquire events after a bad name, want 4", n)
	}

	// The server goes away under a watchdog lease: the renewals fail, are
	// logged (whether the renewal fails before the deadline or runs into
	// it: go-redis dials five times before it gives up, a while on a busy
	// machine), and the lease ends at its deadline as renew_failed.
	doomed := acquire(t, l, "doomed")
	before := len(rec.endsSoFar())
	srv.Kill()
	<-doomed.Done()
	waitFor(t, func() bool { return len(rec.endsSoFar()) > before })
	var doomedEnd *fence.LeaseEvent
	for _, e := range rec.endsSoFar() {
		if e.Name == "doomed" {
			doomedEnd = &e
		}
	}
	if doomedEnd == nil || doomedEnd.Cause != fence.LostRenewFailed {
		t.Fatalf("doomed lease ended %+v, want renew_failed", doomedEnd)
	}
	// The renewal that ran into the deadline returns just after the end.
	waitFor(t, func() bool { return len(h.find("renewal failed")) > 0 })
	fails := h.find("renewal failed")
	if len(fails) == 0 || fails[0]["name"] != "doomed" || fails[0]["token"] != fmt.Sprint(doomed.Token()) || fails[0]["error"] == "" {
		t.Fatalf("renewal failed lines %v", fails)
	}
	waitFor(t, func() bool { return len(h.find("lease lost")) == 2 })
	if lost := h.find("lease lost"); len(lost) != 2 || lost[1]["cause"] != "renew_failed" || lost[1]["name"] != "doomed" {
		t.Fatalf("lease lost lines %v", lost)
	}
}

// TestReplicaSyncRefusalObserved: an acquisition that the expected replica
// did not acknowledge is reported with its figures, and logged.
func TestReplicaSyncRefusalObserved(t *testing.T) {
	srv := redistest.Start(t)
	rec, h := &recorder{}, &records{}
	l := lockerWith(t, srv.Client(t), redislock.Options{Observer: rec, Logger: slog.New(h),
		ReplicaSync: redislock.ReplicaSync{Replicas: 2, Acks: redislock.AcksAll, Timeout: 20 * time.Millisecond}})
	_, err := l.Acquire(ctx(t), "job", fence.TTL(time.Minute))
	wantNotReplicated(t, "Acquire", err, 0, 2)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.refusals) != 1 || rec.refusals[0] != (fence.ReplicaSyncEvent{Backend: "redis", Name: "job", Acked: 0, Required: 2}) {
		t.Fatalf("refusals %+v", rec.refusals)
	}
	if len(rec.acquires) != 1 || rec.acquires[0].Result != fence.NotReplicated {
		t.Fatalf("acquires %+v", rec.acquires)
	}
	lines := h.find("too few replicas")
	if len(lines) != 1 || lines[0]["name"] != "job" || lines[0]["acked"] != "0" || lines[0]["required"] != "2" {
		t.Fatalf("refusal lines %v", lines)
	}
}
