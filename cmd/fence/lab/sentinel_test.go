package lab

import (
	"testing"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
)

// Scenario 12, Sentinel's own failover: with fence's defaults the lock
// refused A (WAIT 0: the replica it recorded was cut off), there was one
// holder, and nothing stale was accepted. Only the protected row runs: the
// control's verdict (replica sync off, A's stale write accepted, P1 > 0,
// the failover losing A's lock) is lab-quick's, in the same make test;
// what lab-quick does not check is that the protected row's lock refused
// and that it had no two holders.
func TestSentinelFailoverProtectedRefuses(t *testing.T) {
	prot := protectedRow(t, runLab(t, Config{rows: protectedOnly}, 12))
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
		r := protectedRow(t, runLab(t, Config{syncOff: true, rows: protectedOnly}, 12))
		if r.Verdict.Refused != 0 || r.Verdict.TwoHolders == 0 {
			t.Errorf("sync off: want the lock not refused and two holders: %s", r.line())
		}
		if !r.Pass || r.Verdict.Rejected == 0 {
			t.Errorf("sync off, guard: want the stale write rejected and the row to pass: %s", r.line())
		}
	})
	t.Run("weak comparison", func(t *testing.T) {
		r := protectedRow(t, runLab(t, Config{syncOff: true, write: worker.WriteWeak, rows: protectedOnly}, 12))
		if r.Pass || r.Verdict.P1 == 0 {
			t.Fatalf("sync off, weakened comparison: protected row passed or showed no P1: %s", r.line())
		}
	})
}
