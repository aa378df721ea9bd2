package memlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// TestNewWatchdogTTLBound pins what New's doc says: a WatchdogTTL under
// fence.MinTTL is refused with fence.ErrInvalidOption, MinTTL itself is
// accepted. (The doc said "shorter than a millisecond", so a user reading
// it took 5 ms to be fine and got an error.)
func TestNewWatchdogTTLBound(t *testing.T) {
	for _, ttl := range []time.Duration{-time.Second, time.Nanosecond, time.Millisecond, fence.MinTTL - time.Nanosecond} {
		if _, err := memlock.New(&memlock.Options{WatchdogTTL: ttl}); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("New with WatchdogTTL %v = %v; want ErrInvalidOption", ttl, err)
		}
	}
	if _, err := memlock.New(&memlock.Options{WatchdogTTL: fence.MinTTL}); err != nil {
		t.Errorf("New with WatchdogTTL fence.MinTTL = %v; want it accepted", err)
	}
}
