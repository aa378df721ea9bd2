package fenceotel_test

import (
	"errors"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fenceotel"
	"github.com/fencekit/fence/internal/observetest"
	"github.com/fencekit/fence/memlock"
)

// TestZeroObserverDoesNotPanicInAcquire gives memlock a zero
// &fenceotel.Observer{} (a careless user who wrote a composite literal
// rather than calling New, or a struct field of type fenceotel.Observer
// taken by address). The Locker is made without complaint, and the first
// Acquire panics inside the Observer, on a nil collector, after the lock
// was taken: the lock path crashes on a metrics mistake. Either New of the
// Locker must refuse it (fence.ErrInvalidOption), or the zero Observer must
// do nothing.
func TestZeroObserverDoesNotPanicInAcquire(t *testing.T) {
	locker, err := memlock.New(&memlock.Options{Observer: &fenceotel.Observer{}})
	if errors.Is(err, fence.ErrInvalidOption) {
		return // refused where it was configured: fine
	}
	if err != nil {
		t.Fatal(err)
	}
	observetest.AcquireReleaseNoPanic(t, locker, "a zero fenceotel.Observer")
}
