package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

// TestLockerNotMadeByNewIsRefused: a zero or nil Locker (declared instead
// of made by New) refuses Acquire with an error matching
// fence.ErrInvalidOption, not ErrNotAcquired, and does not panic. Before,
// Acquire panicked with a nil pointer dereference.
func TestLockerNotMadeByNewIsRefused(t *testing.T) {
	var nilLocker *etcdlock.Locker
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for what, l := range map[string]*etcdlock.Locker{"zero": {}, "nil": nilLocker} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s Locker: Acquire panicked: %v", what, r)
				}
			}()
			lease, err := l.Acquire(ctx, "lock:payment:1001", fence.Wait(time.Second))
			if lease != nil || !errors.Is(err, fence.ErrInvalidOption) || errors.Is(err, fence.ErrNotAcquired) {
				t.Errorf("%s Locker: Acquire = %v, %v; want no lease and an error matching fence.ErrInvalidOption, not ErrNotAcquired", what, lease, err)
			}
		}()
	}
}

// nilObserver is an Observer given as a nil pointer: the nil
// *fenceprom.Observer of a fenceprom.New whose error was ignored is the
// same.
type nilObserver struct{ fence.NopObserver }

// TestNilObserverRefused: Options.Observer holding a nil pointer is refused
// by New (fence.ValidateObserver); before, the first Acquire panicked in
// AcquireDone.
func TestNilObserverRefused(t *testing.T) {
	client := newClient(t, shared.Endpoints(), nil)
	var obs *nilObserver
	if _, err := etcdlock.New(client, &etcdlock.Options{Observer: obs}); !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("New with a nil *nilObserver = %v; want ErrInvalidOption", err)
	}
	if _, err := etcdlock.New(client, &etcdlock.Options{Observer: &nilObserver{}}); err != nil {
		t.Fatalf("New with an Observer = %v", err)
	}
}
