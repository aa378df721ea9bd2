package pglock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/silent"
	"github.com/fencekit/fence/pglock"
)

// An Acquire with a Wait budget on a database that accepts connections
// but never answers: its first try is cut by firstTryMin (the budget is
// shorter). Nothing was learnt about the lock, so the error must not say
// it is held (fence.ErrHeld, counted as Held by the Observer, hiding the
// outage): it must be a backend failure.
func TestFirstTryCutOnSilentServerIsNotHeld(t *testing.T) {
	addr := silent.Addr(t)
	db := open(t, "postgres://fence@"+addr+"/fence?sslmode=disable", nil)
	l, err := pglock.New(db, &pglock.Options{WatchdogTTL: watchdogTTL})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = l.Acquire(ctxFor(t, 20*time.Second), "silent", fence.TTL(time.Minute), fence.Wait(200*time.Millisecond))
	took := time.Since(start)
	t.Logf("after %v: %v", took, err)
	if !errors.Is(err, fence.ErrNotAcquired) {
		t.Fatalf("Acquire on a silent server = %v, want ErrNotAcquired", err)
	}
	if errors.Is(err, fence.ErrHeld) {
		t.Errorf("Acquire on a server that never answered = %v: says the lock is held", err)
	}
	if r := fence.ResultOf(err); r != fence.Failed {
		t.Errorf("ResultOf(%v) = %v, want Failed", err, r)
	}
	if took > 5*time.Second {
		t.Errorf("Acquire took %v", took)
	}
}

// TestBadInputNotObserved: since ReportAcquire reports an ErrInvalidName
// or ErrInvalidOption inside ErrNotAcquired (a refusal found at the
// server) as Failed, pglock must return bad input bare, before the
// database: a bad name, lease time or wait is then neither an
// ErrNotAcquired nor an event. (Held: every case is refused before the
// backend.)
func TestBadInputNotObserved(t *testing.T) {
	d := newDatabase(t, pg)
	rec := &recorder{ends: map[string]fence.LeaseCause{}}
	l, err := pglock.New(d.db, &pglock.Options{WatchdogTTL: watchdogTTL, Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		opts []fence.Option
		want error
	}{
		{"", nil, fence.ErrInvalidName},
		{"a{b}", nil, fence.ErrInvalidName},
		{"a\x00b", nil, fence.ErrInvalidName},
		{"a\x1b[2J", []fence.Option{fence.Wait(time.Second)}, fence.ErrInvalidName},
		{"ok", []fence.Option{fence.TTL(time.Millisecond)}, fence.ErrInvalidOption},
		{"ok", []fence.Option{fence.TTL(-time.Second)}, fence.ErrInvalidOption},
		{"ok", []fence.Option{fence.Wait(-time.Second)}, fence.ErrInvalidOption},
	} {
		lease, err := l.Acquire(ctxFor(t, 10*time.Second), c.name, c.opts...)
		if lease != nil || !errors.Is(err, c.want) || errors.Is(err, fence.ErrNotAcquired) {
			t.Errorf("Acquire(%q) = %v, %v; want %v alone", c.name, lease, err, c.want)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.acquires) != 0 {
		t.Errorf("bad input reported to the Observer: %v", rec.acquires)
	}
}
