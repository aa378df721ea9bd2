package pglock_test

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/pglock"
)

type recorder struct {
	fence.NopObserver
	mu       sync.Mutex
	acquires []fence.AcquireResult
	ends     map[string]fence.LeaseCause
}

func (r *recorder) AcquireDone(e fence.AcquireEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acquires = append(r.acquires, e.Result)
}

func (r *recorder) LeaseEnded(e fence.LeaseEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ends[e.Name] = e.Cause
}

// removalTTL is the watchdog lease time of the tests that delete a lease's
// row and want the lease to end as removed: the next renewal, a third of
// it later, finds the row gone. With a watchdog TTL of 300 ms a renewal
// stalled on a loaded machine let the deadline pass first, and the lease
// ended as renew_failed (TestLogger, in a CI run with -race and five
// packages at once).
const removalTTL = 3 * time.Second

// TestObserver: a lease whose row is deleted behind its holder's back ends
// as removed, a released one as released; a held lock is reported held.
func TestObserver(t *testing.T) {
	d := newDatabase(t, pg)
	rec := &recorder{ends: map[string]fence.LeaseCause{}}
	l, err := pglock.New(d.db, &pglock.Options{WatchdogTTL: removalTTL, Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 30*time.Second)
	lost, err := l.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "job"); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("second Acquire: %v", err)
	}
	d.remove(t, "job")
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
	if rec.ends["job"] != fence.LostRemoved || rec.ends["other"] != fence.Released {
		t.Errorf("causes %v", rec.ends)
	}
}

// TestLogger: a lease whose row is deleted behind its holder's back and a
// watchdog lease whose database handle was closed are logged with name,
// token and cause, and the failed renewals too; a release is not logged,
// no line carries the DSN, and a Locker without a Logger logs nothing, not
// even through slog's default logger.
func TestLogger(t *testing.T) {
	def := &observetest.Logs{}
	old := slog.Default()
	slog.SetDefault(slog.New(def))
	t.Cleanup(func() { slog.SetDefault(old) })

	d := newDatabase(t, pg)
	h, rec := &observetest.Logs{}, &observetest.Recorder{}
	l, err := pglock.New(d.db, &pglock.Options{WatchdogTTL: removalTTL, Observer: rec, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	quiet := d.locker(t, d.db)
	ctx := ctxFor(t, 30*time.Second)
	lost, err := l.Acquire(ctx, "lock:payment:1001")
	if err != nil {
		t.Fatal(err)
	}
	silent, err := quiet.Acquire(ctx, "silent")
	if err != nil {
		t.Fatal(err)
	}
	d.remove(t, "lock:payment:1001")
	d.remove(t, "silent")
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

	// A handle of its own, closed under a watchdog lease: every renewal
	// fails until the deadline.
	db := open(t, d.dsn, nil)
	own, err := pglock.New(db, &pglock.Options{WatchdogTTL: watchdogTTL, Observer: rec, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	doomed, err := own.Acquire(ctx, "doomed")
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	<-doomed.Done()
	ends := rec.WaitEnds(t, 3, 5*time.Second)
	if e := ends[2]; e.Name != "doomed" || e.Cause != fence.LostRenewFailed {
		t.Fatalf("doomed lease ended %+v, want renew_failed", e)
	}
	fails := h.Find("renewal failed")
	if len(fails) == 0 || fails[0]["name"] != "doomed" || fails[0]["token"] != fmt.Sprint(doomed.Token()) || fails[0]["error"] == "" {
		t.Fatalf("renewal failed lines %v", fails)
	}
	if lines := h.Find("lease lost"); len(lines) != 2 || lines[1]["cause"] != "renew_failed" {
		t.Fatalf("lease lost lines %v", lines)
	}
	for _, line := range h.All() {
		for _, v := range line {
			if strings.Contains(v, d.dsn) {
				t.Fatalf("a line carries the DSN: %v", line)
			}
		}
	}
	if n := def.Len(); n != 0 {
		t.Fatalf("%d lines logged through slog's default logger: %v", n, def.All())
	}
}
