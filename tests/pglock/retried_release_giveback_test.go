package pglock_test

import (
	"context"
	"testing"
	"time"
)

// A lease whose row a late renewal moved ahead of its deadline, released
// with a done ctx: that Release sends nothing, but frees the row in the
// background (TestFailedReleaseAfterLateRenewalFreesRow). A Release
// retried after that finds no row of its own, freed by the lease's own
// statement, nothing lost: it must return nil, as after a failed release
// statement of its own. Before the fix the background free did not count
// as one that may have run, and the retry said "fence: lease lost: ...
// expired, was removed or was taken by another owner".
func TestRetriedReleaseAfterOwnGiveBack(t *testing.T) {
	const name = "retried-release-after-give-back"
	lease, db := lateRenewalHeld(t, name, 5*time.Second)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	first := lease.Release(done)
	if first == nil {
		t.Fatal("Release with a done ctx returned nil")
	}
	awaitRowFree(t, db, name, 3*time.Second, "a failed Release ended the lease")
	if err := lease.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("Release retried after the lease's own give-back (the first: %v) = %v, want nil", first, err)
	}
}
