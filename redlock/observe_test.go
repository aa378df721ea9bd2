package redlock_test

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/redlock"
)

type recorder struct {
	fence.NopObserver
	mu       sync.Mutex
	acquires []fence.AcquireResult
	ends     []fence.LeaseEvent
}

func (r *recorder) AcquireDone(e fence.AcquireEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acquires = append(r.acquires, e.Result)
}

func (r *recorder) LeaseEnded(e fence.LeaseEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ends = append(r.ends, e)
}

// TestObserver: a lease whose lock is deleted on a majority of the nodes
// ends as removed; one released, as released; a second Acquire of a held
// lock, as held.
func TestObserver(t *testing.T) {
	srvs := nodes(t, 3)
	rec := &recorder{}
	l := newLocker(t, srvs, &redlock.Options{WatchdogTTL: 2 * time.Second, NodeTimeout: 500 * time.Millisecond, Observer: rec})
	ctx := ctxFor(t)
	lost, err := l.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "job"); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("second Acquire: %v", err)
	}
	for _, s := range srvs[:2] {
		if err := s.Client(t).Del(ctx, lockKey("job")).Err(); err != nil {
			t.Fatal(err)
		}
	}
	<-lost.Done()
	kept, err := l.Acquire(ctx, "other", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := kept.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) { // polling with a deadline
		rec.mu.Lock()
		n := len(rec.ends)
		rec.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d lease ends reported, want 2", n)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if want := []fence.AcquireResult{fence.Acquired, fence.Held, fence.Acquired}; !slices.Equal(rec.acquires, want) {
		t.Errorf("results %v, want %v", rec.acquires, want)
	}
	causes := map[string]fence.LeaseCause{}
	for _, e := range rec.ends {
		causes[e.Name] = e.Cause
		if e.Backend != "redlock" || e.Held <= 0 {
			t.Errorf("event %+v", e)
		}
	}
	if causes["job"] != fence.LostRemoved || causes["other"] != fence.Released {
		t.Errorf("causes %v", causes)
	}
}

// TestLogger: a lease lost because its lock was deleted on a majority and
// a watchdog lease whose majority went away are logged with name, token
// and cause, and the failed renewals too; a release is not logged, and a
// Locker without a Logger logs nothing, not even through slog's default.
func TestLogger(t *testing.T) {
	def := &observetest.Logs{}
	old := slog.Default()
	slog.SetDefault(slog.New(def))
	t.Cleanup(func() { slog.SetDefault(old) })

	srvs := nodes(t, 3)
	h := &observetest.Logs{}
	rec := &observetest.Recorder{}
	l := newLocker(t, srvs, &redlock.Options{WatchdogTTL: 2 * time.Second, NodeTimeout: 200 * time.Millisecond, Observer: rec, Logger: slog.New(h)})
	quiet := newLocker(t, srvs, &redlock.Options{WatchdogTTL: 2 * time.Second, NodeTimeout: 200 * time.Millisecond})
	ctx := ctxFor(t)

	lost, err := l.Acquire(ctx, "lock:payment:1001")
	if err != nil {
		t.Fatal(err)
	}
	silent, err := quiet.Acquire(ctx, "silent")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range srvs[:2] {
		if err := s.Client(t).Del(ctx, lockKey("lock:payment:1001"), lockKey("silent")).Err(); err != nil {
			t.Fatal(err)
		}
	}
	<-lost.Done()
	<-silent.Done()
	rec.WaitEnds(t, 1, 5*time.Second)
	if lines := h.Find("lease lost"); len(lines) != 1 || lines[0]["name"] != "lock:payment:1001" ||
		lines[0]["token"] != fmt.Sprint(lost.Token()) || lines[0]["cause"] != "removed" || lines[0]["level"] != "WARN" {
		t.Fatalf("lease lost lines %v", lines)
	}
	released, err := l.Acquire(ctx, "other", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := released.Release(ctx); err != nil {
		t.Fatal(err)
	}

	doomed, err := l.Acquire(ctx, "doomed")
	if err != nil {
		t.Fatal(err)
	}
	srvs[0].Kill()
	srvs[1].Kill()
	<-doomed.Done()
	ends := rec.WaitEnds(t, 3, 5*time.Second)
	if e := ends[2]; e.Name != "doomed" || e.Cause != fence.LostRenewFailed {
		t.Fatalf("doomed lease ended %+v, want renew_failed", e)
	}
	fails := h.Find("renewal failed")
	if len(fails) == 0 || fails[0]["name"] != "doomed" || fails[0]["token"] != fmt.Sprint(doomed.Token()) || fails[0]["error"] == "" {
		t.Fatalf("renewal failed lines %v", fails)
	}
	if lines := h.Find("lease lost"); len(lines) != 2 || lines[1]["cause"] != "renew_failed" || lines[1]["name"] != "doomed" {
		t.Fatalf("lease lost lines %v", lines)
	}
	if n := def.Len(); n != 0 {
		t.Fatalf("%d lines logged through slog's default logger: %v", n, def.All())
	}
}

// A Logger without an Observer is told of a fixed lease that runs out when
// it does, though nobody asked for the lease's Done or Err: the lease's
// expiry timer is made for it (without one, the expiry would be noticed
// only by a later call, and never logged).
func TestLoggerAloneSeesExpiry(t *testing.T) {
	srvs := nodes(t, 3)
	h := &observetest.Logs{}
	l := newLocker(t, srvs, &redlock.Options{NodeTimeout: 200 * time.Millisecond, Logger: slog.New(h)})
	lease, err := l.Acquire(ctxFor(t), "short", fence.TTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(h.Find("lease lost")) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no lease lost line 10s after a 300ms lease (token %d) ran out", lease.Token())
		}
		time.Sleep(5 * time.Millisecond) // polling for the expiry's log line, with a deadline
	}
	if lines := h.Find("lease lost"); lines[0]["cause"] != "expired" || lines[0]["name"] != "short" {
		t.Fatalf("lease lost lines %v", lines)
	}
}
