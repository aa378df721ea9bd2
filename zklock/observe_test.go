package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/zklock"
)

// TestObserverAndLogs: a lease whose node is deleted behind its holder's
// back, a refused acquisition (held), a released lease, a lease whose
// fence.TTL ran out, and a lease whose server hung for a session timeout
// reach the Observer with the right results and causes, and the Logger
// with name, token and cause; a released lease is observed but not logged.
func TestObserverAndLogs(t *testing.T) {
	srv := startZK(t)
	addrs := []string{srv.Addr}
	rec, h := &observetest.Recorder{}, &observetest.Logs{}
	l, err := zklock.New(connect(t, addrs, nil), sessionTimeout, zklock.WithObserver(rec), zklock.WithLogger(slog.New(h)))
	if err != nil {
		t.Fatal(err)
	}
	admin := connect(t, addrs, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Removed behind the holder's back.
	lost, err := l.Acquire(ctx, "lock:payment:1001")
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Delete(lockNodes(t, admin, "lock:payment:1001")[0], -1); err != nil {
		t.Fatal(err)
	}
	end := rec.WaitEnds(t, 1, 5*time.Second)[0]
	if end.Cause != fence.LostRemoved || end.Token != lost.Token() || end.Name != "lock:payment:1001" || end.Backend != "zookeeper" ||
		!errors.Is(end.Err, fence.ErrLeaseLost) || end.Held <= 0 {
		t.Fatalf("LeaseEnded %+v, want removed, token %d", end, lost.Token())
	}
	if lines := h.Find("lease lost"); len(lines) != 1 || lines[0]["name"] != "lock:payment:1001" ||
		lines[0]["token"] != fmt.Sprint(lost.Token()) || lines[0]["cause"] != "removed" || lines[0]["level"] != "WARN" {
		t.Fatalf("lease lost lines %v", lines)
	}

	// A refusal: held by another.
	holder, err := l.Acquire(ctx, "held")
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
	// A lease time not extended.
	fixed, err := l.Acquire(ctx, "fixed", fence.TTL(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-fixed.Done()
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

	// The server hangs under a lease: no reply for a session timeout, the
	// lease ends at its deadline as renew_failed.
	doomed, err := l.Acquire(ctx, "doomed")
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	defer srv.Cont()
	select {
	case <-doomed.Done():
	case <-time.After(2 * sessionTimeout):
		t.Fatalf("lease held %v after the server hung", 2*sessionTimeout)
	}
	ends := rec.WaitEnds(t, 4, 5*time.Second)
	if e := ends[3]; e.Name != "doomed" || e.Cause != fence.LostRenewFailed || e.Token != doomed.Token() {
		t.Fatalf("doomed lease ended %+v, want renew_failed", e)
	}
	if lines := h.Find("lease lost"); len(lines) != 3 || lines[2]["cause"] != "renew_failed" || lines[2]["name"] != "doomed" {
		t.Fatalf("lease lost lines %v", lines)
	}
	srv.Cont()
	for _, ls := range []fence.Lease{lost, fixed, doomed} {
		if err := ls.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
			t.Fatalf("Release of lost %v: %v", ls, err)
		}
	}
	if n := len(rec.Ends()); n != 4 {
		t.Fatalf("%d lease ends after releasing the lost leases, want still 4", n)
	}
	t.Logf("lines: %v", h.All())
}

// TestObserverNothingLoggedByDefault: a Locker without a Logger logs
// nothing, not even through slog's default logger, when a lease is lost.
func TestObserverNothingLoggedByDefault(t *testing.T) {
	h := &observetest.Logs{}
	old := slog.Default()
	slog.SetDefault(slog.New(h))
	t.Cleanup(func() { slog.SetDefault(old) })

	srv := sharedZK(t)
	rec := &observetest.Recorder{}
	l, err := zklock.New(connect(t, []string{srv.Addr}, nil), sessionTimeout, zklock.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(context.Background(), "job", fence.TTL(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-lease.Done()
	if e := rec.WaitEnds(t, 1, 5*time.Second)[0]; e.Cause != fence.LostExpired {
		t.Fatalf("lease ended %+v, want expired", e)
	}
	if n := h.Len(); n != 0 {
		t.Fatalf("%d lines logged without a Logger: %v", n, h.All())
	}
}
