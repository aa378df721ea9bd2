package lab

import (
	"testing"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
)

// Scenario 12, Sentinel's own failover: with replica sync off (the control)
// both A and B held the lock and A's stale write was accepted; with
// fence's defaults the lock refused A (WAIT 0: the replica it recorded was
// cut off) and nothing stale was accepted.
func TestSentinelFailoverControlFailsProtectedPasses(t *testing.T) {
	rs := runLab(t, Config{}, 12)
	ctl, prot := row(t, rs, "control"), protectedRow(t, rs)
	if !ctl.Pass || ctl.Verdict.TwoHolders == 0 || ctl.Verdict.P1 == 0 {
		t.Errorf("control: want two holders and a stale write accepted: %s", ctl.line())
	}
	if !prot.Pass || prot.Verdict.Refused == 0 || prot.Verdict.TwoHolders != 0 {
		t.Errorf("protected: want the lock refused, one holder, no violation: %s", prot.line())
	}
}

// Mutation: with replica sync off in the protected row, the Sentinel
// failover gives two holders again and only the token saves the run
// (guard rejects A's write); with guard's comparison weakened as well, the
// protected row fails on P1.
func TestMutationSyncOffSentinelFailover(t *testing.T) {
	t.Run("guard", func(t *testing.T) {
		r := protectedRow(t, runLab(t, Config{syncOff: true}, 12))
		if r.Verdict.Refused != 0 || r.Verdict.TwoHolders == 0 {
			t.Errorf("sync off: want the lock not refused and two holders: %s", r.line())
		}
		if !r.Pass || r.Verdict.Rejected == 0 {
			t.Errorf("sync off, guard: want the stale write rejected and the row to pass: %s", r.line())
		}
	})
	t.Run("weak comparison", func(t *testing.T) {
		r := protectedRow(t, runLab(t, Config{syncOff: true, write: worker.WriteWeak}, 12))
		if r.Pass || r.Verdict.P1 == 0 {
			t.Fatalf("sync off, weakened comparison: protected row passed or showed no P1: %s", r.line())
		}
	})
}
