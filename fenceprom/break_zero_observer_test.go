package fenceprom_test

import (
	"errors"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fenceprom"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/memlock"
)

// TestZeroObserverDoesNotPanicInAcquire gives memlock a zero
// &fenceprom.Observer{} (a careless user who wrote a composite literal
// rather than calling New, or a struct field of type fenceprom.Observer
// taken by address). The Locker is made without complaint, and the first
// Acquire panics inside the Observer, on a nil collector, after the lock
// was taken: the lock path crashes on a metrics mistake. Either New of the
// Locker must refuse it (fence.ErrInvalidOption), or the zero Observer must
// do nothing.
func TestZeroObserverDoesNotPanicInAcquire(t *testing.T) {
	locker, err := memlock.New(&memlock.Options{Observer: &fenceprom.Observer{}})
	if errors.Is(err, fence.ErrInvalidOption) {
		return // refused where it was configured: fine
	}
	if err != nil {
		t.Fatal(err)
	}
	observetest.AcquireReleaseNoPanic(t, locker, "a zero fenceprom.Observer")
}
