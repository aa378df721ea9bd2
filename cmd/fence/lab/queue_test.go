package lab

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/lab/worker"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/redistest"
)

// Scenario 13's verdicts as the example ships (the control doubles a
// message at each late commit, the protected row applies every message
// once and rejects a late commit) are judged by fence lab --quick in make
// test; the tests here are the mutations it does not run.

// With the fence's comparison weakened, the deposed consumer's late commit
// gets past the fence; the unique constraint still makes it a no-op, so
// nothing is applied twice, but no late commit is rejected: the protected
// row fails on that count.
func TestQueueMutationWeakComparison(t *testing.T) {
	r := protectedRow(t, runLab(t, Config{write: worker.WriteWeak, rows: []string{"protected"}}, QueueScenario))
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
	r := protectedRow(t, runLab(t, Config{dropUnique: true, rows: []string{"protected"}}, QueueScenario))
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

// The scenario's messages are produced as users produce them, through
// queue.Produce (random message ids) and queue.ProduceID (the caller's),
// so that every entry carries its message id and the consumer keys it by
// that id, not by the entry id: the lab appended with a plain XADD, whose
// entries have no msg_id, and so never ran the key users ship.
func TestQueueProducesMessageIDs(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids, want, err := produce(&experiment{ctx: ctx}, rdb, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 10 || want != 55 {
		t.Fatalf("%d ids, sum %d; want 10, 55: %v", len(ids), want, ids)
	}
	entries, err := rdb.XRange(ctx, queueStream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	random, own := 0, 0
	for _, e := range entries {
		id, _ := e.Values[queue.IDField].(string)
		switch {
		case !ids[id]:
			t.Errorf("entry %s: message id %q not among the ids returned", e.ID, id)
		case strings.HasPrefix(id, "lab-"):
			own++
		case len(id) == 32:
			random++
		default:
			t.Errorf("entry %s: message id %q is neither Produce's nor the lab's own", e.ID, id)
		}
	}
	if random != 5 || own != 5 {
		t.Errorf("%d random message ids, %d of the caller's: want 5 of each", random, own)
	}
}
