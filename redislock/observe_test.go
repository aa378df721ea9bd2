package redislock_test

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
)

// TestNothingLoggedByDefault: a Locker without a Logger logs nothing, not
// even through slog's default logger, while leases are lost, renewals fail
// and replicas refuse.
func TestNothingLoggedByDefault(t *testing.T) {
	h := &observetest.Logs{}
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
	rec := &observetest.Recorder{}
	l = lockerWith(t, c, redislock.Options{WatchdogTTL: watchdogTTL, Observer: rec})
	lease := acquire(t, l, "job")
	c.Del(ctx(t), lockKey("job"))
	<-lease.Done()
	waitFor(t, func() bool { return len(rec.Ends()) == 1 })
	if n := h.Len(); n != 0 {
		t.Fatalf("%d lines logged without a Logger: %v", n, h.All())
	}
}

// TestObserverAndLogs: a lease lost because its key was deleted behind the
// holder's back, a watchdog lease whose server went away, and a refused
// acquisition reach the Observer and the Logger with name, token and cause.
func TestObserverAndLogs(t *testing.T) {
	t.Parallel() // own server, Observer and Logger (not slog's default); mostly waits on lease ends
	srv := redistest.Start(t)
	c := srv.Client(t)
	rec, h := &observetest.Recorder{}, &observetest.Logs{}
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
	waitFor(t, func() bool { return len(rec.Ends()) == 1 })
	end := rec.Ends()[0]
	if end.Cause != fence.LostRemoved || end.Token != lease.Token() || end.Name != "lock:payment:1001" || end.Backend != "redis" ||
		!errors.Is(end.Err, fence.ErrLeaseLost) || end.Held <= 0 {
		t.Fatalf("LeaseEnded %+v, want removed, token %d", end, lease.Token())
	}
	waitFor(t, func() bool { return len(h.Find("lease lost")) == 1 }) // logged after the event
	lost := h.Find("lease lost")
	if len(lost) != 1 || lost[0]["name"] != "lock:payment:1001" || lost[0]["token"] != fmt.Sprint(lease.Token()) ||
		lost[0]["cause"] != "removed" || lost[0]["level"] != "WARN" {
		t.Fatalf("lease lost lines %v", lost)
	}

	// Released: observed, not logged.
	released := acquire(t, l, "other", fence.TTL(time.Minute))
	if err := released.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if ends := rec.Ends(); len(ends) != 2 || ends[1].Cause != fence.Released || ends[1].Token != released.Token() {
		t.Fatalf("after Release, ends %+v", ends)
	}
	if n := len(h.Find("lease lost")); n != 1 {
		t.Fatalf("%d lease lost lines after a Release, want still 1", n)
	}

	// Held: one try, one event.
	holder := acquire(t, l, "held", fence.TTL(time.Minute))
	if _, err := l.Acquire(ctx(t), "held"); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("second Acquire: %v", err)
	}
	acquires := rec.Acquires()
	results := make([]fence.AcquireResult, 0, len(acquires))
	for _, a := range acquires {
		results = append(results, a.Result)
	}
	last := acquires[len(acquires)-1]
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
	n := len(rec.Acquires())
	if n != 4 {
		t.Fatalf("%d acquire events after a bad name, want 4", n)
	}

	// The server goes away under a watchdog lease: the renewals fail, are
	// logged (whether the renewal fails before the deadline or runs into
	// it: go-redis dials five times before it gives up, a while on a busy
	// machine), and the lease ends at its deadline as renew_failed.
	doomed := acquire(t, l, "doomed")
	before := len(rec.Ends())
	srv.Kill()
	<-doomed.Done()
	waitFor(t, func() bool { return len(rec.Ends()) > before })
	var doomedEnd *fence.LeaseEvent
	for _, e := range rec.Ends() {
		if e.Name == "doomed" {
			doomedEnd = &e
		}
	}
	if doomedEnd == nil || doomedEnd.Cause != fence.LostRenewFailed {
		t.Fatalf("doomed lease ended %+v, want renew_failed", doomedEnd)
	}
	// The renewal that ran into the deadline returns just after the end.
	waitFor(t, func() bool { return len(h.Find("renewal failed")) > 0 })
	fails := h.Find("renewal failed")
	if len(fails) == 0 || fails[0]["name"] != "doomed" || fails[0]["token"] != fmt.Sprint(doomed.Token()) || fails[0]["error"] == "" {
		t.Fatalf("renewal failed lines %v", fails)
	}
	waitFor(t, func() bool { return len(h.Find("lease lost")) == 2 })
	if lost := h.Find("lease lost"); len(lost) != 2 || lost[1]["cause"] != "renew_failed" || lost[1]["name"] != "doomed" {
		t.Fatalf("lease lost lines %v", lost)
	}
}

// TestReplicaSyncRefusalObserved: an acquisition that the expected replica
// did not acknowledge is reported with its figures, and logged.
func TestReplicaSyncRefusalObserved(t *testing.T) {
	srv := redistest.Start(t)
	rec, h := &observetest.Recorder{}, &observetest.Logs{}
	l := lockerWith(t, srv.Client(t), redislock.Options{Observer: rec, Logger: slog.New(h),
		ReplicaSync: redislock.ReplicaSync{Replicas: 2, Acks: redislock.AcksAll, Timeout: 20 * time.Millisecond}})
	_, err := l.Acquire(ctx(t), "job", fence.TTL(time.Minute))
	wantNotReplicated(t, "Acquire", err, 0, 2)
	if len(rec.Refusals()) != 1 || rec.Refusals()[0] != (fence.ReplicaSyncEvent{Backend: "redis", Name: "job", Acked: 0, Required: 2}) {
		t.Fatalf("refusals %+v", rec.Refusals())
	}
	if len(rec.Acquires()) != 1 || rec.Acquires()[0].Result != fence.NotReplicated {
		t.Fatalf("acquires %+v", rec.Acquires())
	}
	lines := h.Find("too few replicas")
	if len(lines) != 1 || lines[0]["name"] != "job" || lines[0]["acked"] != "0" || lines[0]["required"] != "2" {
		t.Fatalf("refusal lines %v", lines)
	}
}
