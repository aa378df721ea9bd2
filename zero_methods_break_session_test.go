package fence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redislock"
	"github.com/fencekit/fence/redlock"
)

// TestLockerNotMadeByNewOtherMethods: the made() checks cover Acquire,
// Status and the replica calls; the other methods that return an error
// must not panic on a nil Locker either (a nil *Locker from a New whose
// error was ignored, then `defer l.Close(ctx)` or WaitGiveBacks on ^C).
// Before: redislock's WaitGiveBacks and redlock's Close dereferenced nil.
func TestLockerNotMadeByNewOtherMethods(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var nilRedis *redislock.Locker
	var nilRedlock *redlock.Locker
	for what, call := range map[string]func() error{
		"nil redislock: WaitGiveBacks": func() error { return nilRedis.WaitGiveBacks(ctx) },
		"nil redlock: Close":           func() error { return nilRedlock.Close(ctx) },
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s panicked: %v", what, r)
				}
			}()
			if err := call(); !errors.Is(err, fence.ErrInvalidOption) {
				t.Errorf("%s = %v; want an error matching fence.ErrInvalidOption", what, err)
			}
		}()
	}
	// A zero Locker has nothing to wait for or to release: nil, at once.
	if err := (&redislock.Locker{}).WaitGiveBacks(ctx); err != nil {
		t.Errorf("zero redislock: WaitGiveBacks = %v", err)
	}
	if err := (&redlock.Locker{}).Close(ctx); err != nil {
		t.Errorf("zero redlock: Close = %v", err)
	}
}
