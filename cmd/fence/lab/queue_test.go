package lab

import (
	"testing"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
)

// Scenario 13, the single active consumer of examples/queue: without the
// fence and the unique constraint (the control) both late commits are
// accepted and their messages applied twice; as the example ships, every
// message is applied once and the deposed consumer's late commit is
// rejected by the fence.
func TestQueueSingleConsumer(t *testing.T) {
	rs := runLab(t, Config{}, QueueScenario)
	for _, r := range rs {
		if !r.Pass {
			t.Errorf("%s row failed: %s", r.Config, r.line())
		}
		if r.Verdict.Messages != 200 {
			t.Errorf("%s row: %d messages, want 200", r.Config, r.Verdict.Messages)
		}
	}
	ctl, prot := row(t, rs, "control"), protectedRow(t, rs)
	// The two late commits: before the fence (fault 1), and inside the
	// transaction, committed first (fault 2).
	if ctl.Verdict.Doubled < 2 || ctl.Verdict.Lost != 0 {
		t.Errorf("control: %d doubled, %d lost; want at least 2 doubled, none lost", ctl.Verdict.Doubled, ctl.Verdict.Lost)
	}
	if prot.Verdict.Rejected == 0 || prot.Verdict.P3 != 0 {
		t.Errorf("protected: %d late commits rejected, P3 %d; want some rejected, P3 0", prot.Verdict.Rejected, prot.Verdict.P3)
	}
}

// With the fence's comparison weakened, the deposed consumer's late commit
// gets past the fence; the unique constraint still makes it a no-op, so
// nothing is applied twice, but no late commit is rejected: the protected
// row fails on that count.
func TestQueueMutationWeakComparison(t *testing.T) {
	r := protectedRow(t, runLab(t, Config{write: worker.WriteWeak}, QueueScenario))
	if r.Pass || r.Verdict.Rejected != 0 {
		t.Fatalf("weakened comparison: protected row passed or rejected a late commit: %s", r.line())
	}
	if r.Verdict.P3 != 0 {
		t.Errorf("weakened comparison: P3 %d, want 0 (the unique constraint)", r.Verdict.P3)
	}
}

// With the unique constraint on the message id dropped, the consumer
// paused inside its transaction (after the fence) commits first, and the
// new leader, whose greater token the fence accepts after it, applies the
// message again: the protected row fails on P3.
func TestQueueMutationNoUniqueConstraint(t *testing.T) {
	r := protectedRow(t, runLab(t, Config{dropUnique: true}, QueueScenario))
	if r.Pass || r.Verdict.Doubled == 0 {
		t.Fatalf("unique constraint dropped: protected row passed or doubled nothing: %s", r.line())
	}
}

// The control row must show each of the two late commits doubled, not one
// of them: a consumer change that makes fault 1 a no-op (a SELECT of the
// message before the INSERT caught A's late commit once) left the control
// at 1 doubled, "ok", because P3 > 0 was all it asked.
func TestQueueControlNeedsEachFaultDoubled(t *testing.T) {
	faults := []string{"1-0", "2-0"}
	for _, c := range []struct {
		counts map[string]int
		bit    bool
	}{
		{map[string]int{"1-0": 2, "2-0": 2, "3-0": 1}, true},
		{map[string]int{"1-0": 1, "2-0": 2}, false},
		{map[string]int{"1-0": 2, "2-0": 1}, false},
		{map[string]int{"1-0": 2}, false},
	} {
		note := controlFaultsNote(c.counts, faults)
		if (note == "") != c.bit {
			t.Errorf("%v: note %q, want bitten %v", c.counts, note, c.bit)
		}
	}
	if note := controlFaultsNote(map[string]int{"1-0": 2}, faults[:1]); note != "" {
		t.Errorf("a run that ended after fault 1 (noted elsewhere): %q", note)
	}
}
