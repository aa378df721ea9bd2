package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/refused"
	"github.com/fencekit/fence/internal/silent"
)

// TestPrefixOnLockerNotMadeByNew: Prefix on a nil Locker (a New whose
// error was ignored) or a zero one does not panic, and names the keys New
// with default options would use.
func TestPrefixOnLockerNotMadeByNew(t *testing.T) {
	want := etcdlock.DefaultPrefix + "a%2Fb/"
	var nilLocker *etcdlock.Locker
	for what, l := range map[string]*etcdlock.Locker{"zero": {}, "nil": nilLocker} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s Locker: Prefix panicked: %v", what, r)
				}
			}()
			if got := l.Prefix("a/b"); got != want {
				t.Errorf("%s Locker: Prefix(%q) = %q; want %q", what, "a/b", got, want)
			}
		}()
	}
}

// TestDeadEndpointsKeepCallersDeadline: on an endpoint that accepts and
// never answers, and on one that refuses connections, Acquire (try-lock
// and with a wait budget longer than ctx) returns an error within the
// caller's deadline, not ErrHeld, and Close returns within its own.
func TestDeadEndpointsKeepCallersDeadline(t *testing.T) {
	for what, addr := range map[string]string{"silent": silent.Addr(t), "refused": refused.Addr(t)} {
		t.Run(what, func(t *testing.T) {
			l := newLocker(t, []string{"http://" + addr}, nil)
			for _, opts := range [][]fence.Option{nil, {fence.Wait(time.Minute)}, {fence.TTL(time.Second)}} {
				ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
				start := time.Now()
				lease, err := l.Acquire(ctx, "dead-endpoint", opts...)
				took := time.Since(start)
				cancel()
				if lease != nil || !errors.Is(err, fence.ErrNotAcquired) || errors.Is(err, fence.ErrHeld) {
					t.Errorf("Acquire(%d opts) = %v, %v; want ErrNotAcquired, not ErrHeld", len(opts), lease, err)
				}
				if took > 3*time.Second {
					t.Errorf("Acquire(%d opts) took %v with a 700 ms deadline", len(opts), took)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
			defer cancel()
			start := time.Now()
			_ = l.Close(ctx)
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("Close took %v with a 700 ms deadline", took)
			}
		})
	}
}
