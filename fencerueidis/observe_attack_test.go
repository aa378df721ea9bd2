package fencerueidis_test

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

// TestObserverAndLogs: as redislock's test of that name, on rueidis: a
// lease lost because its key was deleted, a release, a held try, bad input
// (not reported), a replica-sync refusal, and a watchdog lease whose
// server went away reach the Observer and the Logger with name, token and
// cause, as on go-redis.
func TestObserverAndLogs(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	rec, h := &observetest.Recorder{}, &observetest.Logs{}
	l := newLocker(t, client(t, srv.Addr), redislock.Options{WatchdogTTL: 2 * time.Second, Observer: rec, Logger: slog.New(h)})

	lease, err := l.Acquire(ctx(t), "lock:payment:1001")
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Del(ctx(t), lockKey("lock:payment:1001")).Err(); err != nil {
		t.Fatal(err)
	}
	<-lease.Done()
	waitFor(t, func() bool { return len(rec.Ends()) == 1 })
	end := rec.Ends()[0]
	if end.Cause != fence.LostRemoved || end.Token != lease.Token() || end.Name != "lock:payment:1001" || end.Backend != "redis" ||
		!errors.Is(end.Err, fence.ErrLeaseLost) || end.Held <= 0 {
		t.Fatalf("LeaseEnded %+v, want removed, token %d", end, lease.Token())
	}
	waitFor(t, func() bool { return len(h.Find("lease lost")) == 1 })
	if lost := h.Find("lease lost"); lost[0]["token"] != fmt.Sprint(lease.Token()) || lost[0]["cause"] != "removed" {
		t.Fatalf("lease lost lines %v", lost)
	}

	released, err := l.Acquire(ctx(t), "other", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := released.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if ends := rec.Ends(); len(ends) != 2 || ends[1].Cause != fence.Released || ends[1].Token != released.Token() {
		t.Fatalf("after Release, ends %+v", ends)
	}
	if _, err := l.Acquire(ctx(t), "held", fence.TTL(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx(t), "held"); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("second Acquire: %v", err)
	}
	if _, err := l.Acquire(ctx(t), ""); !errors.Is(err, fence.ErrInvalidName) {
		t.Fatal(err)
	}
	var results []fence.AcquireResult
	for _, a := range rec.Acquires() {
		results = append(results, a.Result)
	}
	if want := []fence.AcquireResult{fence.Acquired, fence.Acquired, fence.Acquired, fence.Held}; !slices.Equal(results, want) {
		t.Fatalf("acquire results %v, want %v", results, want)
	}

	strict := newLocker(t, client(t, srv.Addr), redislock.Options{Observer: rec,
		ReplicaSync: redislock.ReplicaSync{Replicas: 2, Acks: redislock.AcksAll, Timeout: 20 * time.Millisecond}})
	if _, err := strict.Acquire(ctx(t), "job", fence.TTL(time.Minute)); !errors.Is(err, fence.ErrNotReplicated) {
		t.Fatalf("Acquire with 2 replicas expected, none there: %v", err)
	}
	if r := rec.Refusals(); len(r) != 1 || r[0] != (fence.ReplicaSyncEvent{Backend: "redis", Name: "job", Acked: 0, Required: 2}) {
		t.Fatalf("refusals %+v", r)
	}

	doomed, err := l.Acquire(ctx(t), "doomed")
	if err != nil {
		t.Fatal(err)
	}
	before := len(rec.Ends())
	srv.Kill()
	select {
	case <-doomed.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the watchdog lease (2 s) did not end 10 s after its server was killed")
	}
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
	waitFor(t, func() bool { return len(h.Find("renewal failed")) > 0 })
	if fails := h.Find("renewal failed"); fails[0]["name"] != "doomed" || fails[0]["error"] == "" {
		t.Fatalf("renewal failed lines %v", fails)
	}
}
