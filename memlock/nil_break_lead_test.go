package memlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// A nil *memlock.Locker (a field never set, the result of a New whose
// error was ignored) is refused as the other backends refuse theirs
// (fence's TestLockerNotMadeByNewIsRefused): an error matching
// fence.ErrInvalidOption, not ErrNotAcquired, and no panic; and Lead on it
// returns that error at once. Before, Acquire panicked with a nil pointer
// dereference, on the caller's goroutine or Lead's.
func TestNilLockerIsRefused(t *testing.T) {
	var l *memlock.Locker
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Acquire on a nil *Locker panicked: %v", r)
			}
		}()
		lease, err := l.Acquire(t.Context(), "x", fence.Wait(time.Second))
		if lease != nil || !errors.Is(err, fence.ErrInvalidOption) || errors.Is(err, fence.ErrNotAcquired) {
			t.Fatalf("Acquire on a nil *Locker = %v, %v; want ErrInvalidOption, not ErrNotAcquired", lease, err)
		}
		if l.Remove("x") {
			t.Fatal("Remove on a nil *Locker reported a lock")
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = errors.New("Lead panicked")
			}
		}()
		return fence.Lead(ctx, l, "x", func(context.Context, fence.Lease) error { return nil })
	}()
	if !errors.Is(err, fence.ErrInvalidOption) {
		t.Fatalf("Lead on a nil *Locker = %v, want ErrInvalidOption at once", err)
	}
}
