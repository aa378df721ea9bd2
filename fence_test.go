package fence_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"lock:payment:1001", "x", "결제:1001", strings.Repeat("n", fence.MaxNameLen)} {
		if err := fence.ValidateName(ok); err != nil {
			t.Errorf("ValidateName(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "{", "a}", "a\x00", "a\r", "\x7f", "\xc0", strings.Repeat("n", fence.MaxNameLen+1)} {
		if err := fence.ValidateName(bad); !errors.Is(err, fence.ErrInvalidName) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalidName", bad, err)
		}
	}
}

func TestApply(t *testing.T) {
	o, err := fence.Apply(nil)
	if err != nil || o.Wait != 0 || o.TTL != 0 {
		t.Fatalf("Apply(nil) = %+v, %v; want zero options", o, err)
	}
	o, err = fence.Apply([]fence.Option{fence.Wait(2 * time.Second), fence.TTL(10 * time.Second)})
	if err != nil || o.Wait != 2*time.Second || o.TTL != 10*time.Second {
		t.Fatalf("Apply = %+v, %v", o, err)
	}
	for _, bad := range [][]fence.Option{{fence.TTL(0)}, {fence.TTL(-1)}, {fence.Wait(-1)}, {fence.TTL(999 * time.Microsecond)}, {fence.TTL(fence.MinTTL - 1)}} {
		if _, err := fence.Apply(bad); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("Apply = %v, want ErrInvalidOption", err)
		}
	}
}

func TestMinTTL(t *testing.T) {
	if err := fence.ValidateTTL(fence.MinTTL); err != nil {
		t.Fatalf("ValidateTTL(MinTTL) = %v", err)
	}
	for _, bad := range []time.Duration{time.Millisecond, 2 * time.Millisecond, fence.MinTTL - 1} {
		if err := fence.ValidateTTL(bad); !errors.Is(err, fence.ErrInvalidOption) || !strings.Contains(err.Error(), "10ms") {
			t.Errorf("ValidateTTL(%v) = %v, want ErrInvalidOption naming the 10ms minimum", bad, err)
		}
	}
}

func TestErrors(t *testing.T) {
	err := fence.NotAcquired("n", fence.ErrHeld)
	if !errors.Is(err, fence.ErrNotAcquired) || !errors.Is(err, fence.ErrHeld) {
		t.Fatalf("NotAcquired does not match both errors: %v", err)
	}
	var nr error = &fence.NotReplicatedError{Acked: 0, Required: 1}
	if !errors.Is(fence.NotAcquired("n", nr), fence.ErrNotReplicated) {
		t.Fatalf("NotReplicatedError does not match ErrNotReplicated")
	}
}
