package redlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// The Lease contract: Extend returns an error matching fence.ErrLeaseLost
// once the lock is no longer held by the lease, as after its Release
// (memlock, pglock and etcdlock return one matching ErrReleased too).
func TestExtendAfterReleaseMatchesLeaseLost(t *testing.T) {
	srvs := nodes(t, 3)
	l := newLocker(t, srvs, nil)
	lease, err := l.Acquire(ctxFor(t), "extend-after-release", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	if err := lease.Extend(ctxFor(t), time.Minute); !errors.Is(err, fence.ErrLeaseLost) || !errors.Is(err, fence.ErrReleased) {
		t.Fatalf("Extend after Release = %v, want ErrLeaseLost and ErrReleased", err)
	}
}
