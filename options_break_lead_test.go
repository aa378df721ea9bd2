package fence_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/memlock"
)

// Options has exported fields and Option is a plain func(*Options), so a
// user can write an Option of their own (a wrapper that picks a lease time
// from config, say). A TTL set that way must be checked as fence.TTL's is:
// before, Apply let a negative or sub-MinTTL TTL through, and memlock
// granted a lease that had ended before Acquire returned (a negative TTL:
// Deadline before the grant).
func TestApplyChecksTTLSetByHandWrittenOption(t *testing.T) {
	for _, ttl := range []time.Duration{-time.Second, -1, time.Nanosecond, fence.MinTTL - 1} {
		opt := fence.Option(func(o *fence.Options) { o.TTL = ttl })
		_, err := fence.Apply([]fence.Option{opt})
		if !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), ttl.String()) {
			t.Errorf("Apply(TTL set to %v by hand) = %v, want ErrInvalidOption naming %v", ttl, err, ttl)
		}
		l, _ := memlock.New(nil)
		lease, err := l.Acquire(t.Context(), "x", opt)
		if err == nil {
			t.Errorf("memlock Acquire with TTL %v set by hand granted a lease (deadline in %v, Err %v)", ttl, time.Until(lease.Deadline()), lease.Err())
			_ = lease.Release(t.Context())
		}
	}
	// A hand-written Option that leaves TTL zero still means "watchdog".
	o, err := fence.Apply([]fence.Option{func(o *fence.Options) { o.Wait = time.Second }})
	if err != nil || o.TTL != 0 || o.Wait != time.Second {
		t.Fatalf("Apply(Wait set by hand) = %+v, %v", o, err)
	}
}
