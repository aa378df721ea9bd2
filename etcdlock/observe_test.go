package etcdlock_test

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdtest"
	"github.com/fencekit/fence/internal/observetest"
)

// TestObserverAndLogs: a lease whose key is deleted behind its holder's
// back, a refused acquisition (held), a released lease, a fixed lease not
// extended in time, and a watchdog lease whose server went away reach the
// Observer with the right results and causes, and the Logger with name,
// token and cause; a released lease is observed but not logged.
func TestObserverAndLogs(t *testing.T) {
	c := etcdtest.Start(t)
	rec, h := &observetest.Recorder{}, &observetest.Logs{}
	l := newLocker(t, c.Endpoints(), &etcdlock.Options{WatchdogTTL: 2 * time.Second, Observer: rec, Logger: slog.New(h)})
	client := newClient(t, c.Endpoints(), nil)
	ctx := ctxFor(t, 60*time.Second)

	// Removed behind the holder's back.
	lost, err := l.Acquire(ctx, "lock:payment:1001")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Delete(ctx, lost.(*etcdlock.Lease).Key()); err != nil {
		t.Fatal(err)
	}
	waitDone(t, lost, 5*time.Second)
	end := rec.WaitEnds(t, 1, 5*time.Second)[0]
	if end.Cause != fence.LostRemoved || end.Token != lost.Token() || end.Name != "lock:payment:1001" || end.Backend != "etcd" ||
		!errors.Is(end.Err, fence.ErrLeaseLost) || end.Held <= 0 {
		t.Fatalf("LeaseEnded %+v, want removed, token %d", end, lost.Token())
	}
	if lines := h.Find("lease lost"); len(lines) != 1 || lines[0]["name"] != "lock:payment:1001" ||
		lines[0]["token"] != fmt.Sprint(lost.Token()) || lines[0]["cause"] != "removed" || lines[0]["level"] != "WARN" {
		t.Fatalf("lease lost lines %v", lines)
	}

	// A refusal: held by another.
	holder, err := l.Acquire(ctx, "held", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "held"); !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("second Acquire: %v, want ErrHeld", err)
	}
	acq := rec.Acquires()
	if last := acq[len(acq)-1]; last.Result != fence.Held || last.Name != "held" || last.Token != 0 || last.Wait <= 0 {
		t.Fatalf("held event %+v", last)
	}
	// Bad input is not an acquisition.
	if _, err := l.Acquire(ctx, ""); !errors.Is(err, fence.ErrInvalidName) {
		t.Fatal(err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A fixed lease not extended.
	fixed, err := l.Acquire(ctx, "fixed", fence.TTL(fence.MinTTL), fence.Wait(5*time.Second)) // a Wait: a take answered past 10 ms (a loaded machine) is given back and tried again
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, fixed, 5*time.Second)
	rec.WaitEnds(t, 3, 5*time.Second)

	wantResults := map[fence.AcquireResult]int{fence.Acquired: 3, fence.Held: 1}
	wantCauses := map[fence.LeaseCause]int{fence.LostRemoved: 1, fence.Released: 1, fence.LostExpired: 1}
	if got := rec.Results(); !maps.Equal(got, wantResults) {
		t.Fatalf("results %v, want %v", got, wantResults)
	}
	if got := rec.Causes(); !maps.Equal(got, wantCauses) {
		t.Fatalf("causes %v, want %v", got, wantCauses)
	}
	if n := len(h.Find("lease lost")); n != 2 {
		t.Fatalf("%d lease lost lines, want 2 (a release is not logged): %v", n, h.All())
	}

	// The server goes away under a watchdog lease: its renewals fail, are
	// logged, and the lease ends at its deadline as renew_failed.
	doomed, err := l.Acquire(ctx, "doomed")
	if err != nil {
		t.Fatal(err)
	}
	c.Members[0].Kill()
	waitDone(t, doomed, 5*time.Second)
	ends := rec.WaitEnds(t, 4, 5*time.Second)
	if e := ends[3]; e.Name != "doomed" || e.Cause != fence.LostRenewFailed || e.Token != doomed.Token() {
		t.Fatalf("doomed lease ended %+v, want renew_failed", e)
	}
	fails := h.Find("renewal failed")
	if len(fails) == 0 || fails[0]["name"] != "doomed" || fails[0]["token"] != fmt.Sprint(doomed.Token()) || fails[0]["error"] == "" {
		t.Fatalf("renewal failed lines %v", fails)
	}
	if lines := h.Find("lease lost"); len(lines) != 3 || lines[2]["cause"] != "renew_failed" {
		t.Fatalf("lease lost lines %v", lines)
	}
	// Release joins each lost lease's goroutine (its revoke ends within
	// half a second), and reports the loss again without a new event.
	for _, ls := range []fence.Lease{lost, fixed, doomed} {
		if err := ls.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Release of lost %v: %v", ls, err)
		}
	}
	if n := len(rec.Ends()); n != 4 {
		t.Fatalf("%d lease ends after releasing the lost leases, want still 4", n)
	}
}

// TestNothingLoggedByDefault: a Locker without a Logger logs nothing, not
// even through slog's default logger, when a lease is lost.
func TestNothingLoggedByDefault(t *testing.T) {
	h := &observetest.Logs{}
	old := slog.Default()
	slog.SetDefault(slog.New(h))
	t.Cleanup(func() { slog.SetDefault(old) })

	rec := &observetest.Recorder{}
	l := newLocker(t, []string{exampleEndpoint}, &etcdlock.Options{Observer: rec})
	ctx := ctxFor(t, 30*time.Second)
	lease, err := l.Acquire(ctx, t.Name(), fence.TTL(fence.MinTTL), fence.Wait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, lease, 5*time.Second)
	rec.WaitEnds(t, 1, 5*time.Second)
	if err := lease.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release of an expired lease: %v", err)
	}
	if n := h.Len(); n != 0 {
		t.Fatalf("%d lines logged without a Logger: %v", n, h.All())
	}
}
