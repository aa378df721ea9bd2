package cli

import (
	"errors"
	"fmt"
	"testing"

	"github.com/fencekit/fence"
)

// A take whose reply came after the lease's deadline (every backend gives
// it back and says so with an error matching ErrLeaseLost) exits as a lease
// lost before the command started, not as a usage or connection error
// (exit 2, which TestExecTTLBelowMinimum saw in a loaded run for a 10 ms
// lease whose reply took 34 ms).
func TestAcquireErrorLateReply(t *testing.T) {
	late := fence.NotAcquired("n", fmt.Errorf("%w: redislock: the reply that took the lock came too late", fence.ErrLeaseLost))
	var ee *exitError
	if err := acquireError(late); !errors.As(err, &ee) || ee.code != ExitLeaseLost || !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("acquireError(late reply) = %v, want exit %d wrapping it", err, ExitLeaseLost)
	}
	held := fence.NotAcquired("n", fence.ErrHeld)
	if err := acquireError(held); !errors.As(err, &ee) || ee.code != ExitNotAcquired {
		t.Fatalf("acquireError(held) = %v, want exit %d", err, ExitNotAcquired)
	}
}
