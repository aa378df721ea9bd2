package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
)

// TestCloseOnLockerNotMadeByNew: Close on a nil Locker (a New whose error
// was ignored, then `defer l.Close(ctx)`) returns an error matching
// fence.ErrInvalidOption instead of panicking; on a zero one it has
// nothing to revoke and returns nil. Before: nil dereference.
func TestCloseOnLockerNotMadeByNew(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var nilLocker *etcdlock.Locker
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("nil Locker: Close panicked: %v", r)
			}
		}()
		if err := nilLocker.Close(ctx); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("nil Locker: Close = %v; want an error matching fence.ErrInvalidOption", err)
		}
	}()
	if err := (&etcdlock.Locker{}).Close(ctx); err != nil {
		t.Errorf("zero Locker: Close = %v", err)
	}
}
