package lab

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
	"github.com/fencekit/fence/redlock"
)

// Scenario 7, a Redlock node restarted at once without persistence: A's
// lease rests on N0–N2, N2 comes back empty and B is granted N2–N4 while A
// still holds it. With fence's defaults there are two holders (the lock is
// the same as the control's) and guard rejects A's late write (the
// restarted node's clock floor gave B a greater token). Only the protected
// row runs: the control's verdict (A's late write accepted, P1 > 0, with
// the fault biting: B granted at once) is lab-quick's, in the same make
// test; what lab-quick does not check is that the protected row had two
// holders and that guard rejected a write.
func TestRedlockRestartProtectedRejectsTheStaleWrite(t *testing.T) {
	prot := protectedRow(t, runLab(t, Config{rows: protectedOnly}, 7))
	if !prot.Pass || prot.Verdict.TwoHolders == 0 || prot.Verdict.Rejected == 0 {
		t.Errorf("protected: want two holders, the stale write rejected, no violation: %s", prot.line())
	}
}

// Scenario 8, a clock jump on one node (PEXPIRE on its lock key) with B
// partitioned from N0 and N1: two holders, and guard rejects A's late
// write (N2 had seen A's token and issued B a greater one). Only the
// protected row runs, as in scenario 7: lab-quick shows the control
// accepting A's late write.
func TestRedlockClockJumpProtectedRejectsTheStaleWrite(t *testing.T) {
	prot := protectedRow(t, runLab(t, Config{rows: protectedOnly}, 8))
	if !prot.Pass || prot.Verdict.TwoHolders == 0 || prot.Verdict.Rejected == 0 {
		t.Errorf("protected: want two holders, the stale write rejected, no violation: %s", prot.line())
	}
}

// Scenario 9, a pause inside Acquire between sending the requests and
// reading the replies, longer than the lease: the naive lock hands out the
// expired grant; fence's redlock refuses it by its validity check and
// nothing expired is handed out.
func TestPausedAcquisitionControlFailsProtectedPasses(t *testing.T) {
	rs := runLab(t, Config{}, 9)
	ctl, prot := row(t, rs, "control"), protectedRow(t, rs)
	if !ctl.Pass || ctl.Verdict.Expired == 0 {
		t.Errorf("control: want an expired grant handed out: %s", ctl.line())
	}
	if !prot.Pass || prot.Verdict.Expired != 0 || prot.Verdict.Refused == 0 {
		t.Errorf("protected: want the acquisition refused, no expired grant: %s", prot.line())
	}
	refused := false
	for _, e := range prot.timeline.events {
		if e.Kind == "acquire" && e.Phase == "fail" && strings.Contains(e.Err, redlock.ErrValidity.Error()) {
			refused = true
		}
	}
	if !refused {
		t.Errorf("protected: no acquisition refused with %v", redlock.ErrValidity)
	}
}

// Mutation: with guard's comparison weakened, the Redlock scenarios'
// protected rows fail on P1: the two holders are the lock's doing, and
// only the token check stood between A's late write and the register.
func TestMutationWeakComparisonRedlock(t *testing.T) {
	for _, n := range []int{7, 8} {
		r := protectedRow(t, runLab(t, Config{write: worker.WriteWeak, rows: protectedOnly}, n))
		if r.Pass || r.Verdict.P1 == 0 || r.Verdict.TwoHolders == 0 {
			t.Errorf("scenario %d, weakened comparison: protected row passed or showed no P1 or no two holders: %s", n, r.line())
		}
	}
}

// Without their fault the Redlock scenarios' runs fail, control and
// protected alike, as runs whose fault did not bite: in 7 and 8 B has to
// wait out A's lease (one holder, nothing stale); in 10 A's acquisition
// ends without the pause.
func TestRedlockScenariosWithoutTheFaultFail(t *testing.T) {
	for _, n := range []int{7, 9} {
		for _, r := range runLab(t, Config{skipFault: true}, n) {
			if r.Pass || !strings.Contains(r.FaultNote, "did not bite") {
				t.Errorf("scenario %d without its fault: want a failed run noting a fault that did not bite: %s", n, r.line())
			}
		}
	}
}
