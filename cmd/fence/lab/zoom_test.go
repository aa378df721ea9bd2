package lab

import (
	"strings"
	"testing"

	"github.com/fencekit/fence"
)

// A round with a stale write: a paused by a pause from 2 to 40 while b
// takes the lock at 30 and writes; a writes at 45.
func staleRound(accepted bool) *timeline {
	evs := []Event{
		{Worker: "a", Op: "a-1", Key: "k", Kind: "acquire", Phase: "invoke", Mono: 1e6},
		{Worker: "a", Op: "a-1", Key: "k", Kind: "acquire", Phase: "ok", Token: 1, Mono: 1.5e6},
		{Worker: "a", Op: "a-1", Key: "k", Kind: "pause", Phase: "invoke", Token: 1, Mono: 2e6},
		{Worker: "b", Op: "b-1", Key: "k", Kind: "acquire", Phase: "ok", Token: 2, Mono: 30e6},
		{Worker: "b", Op: "b-1", Key: "k", Kind: "release", Phase: "invoke", Token: 2, Mono: 35e6},
		{Worker: "a", Op: "a-1", Key: "k", Kind: "pause", Phase: "ok", Token: 1, Mono: 40e6},
		{Worker: "a", Op: "a-1", Key: "k", Kind: "write", Phase: "invoke", Token: 1, Mono: 41e6},
		{Worker: "a", Op: "a-1", Key: "k", Kind: "write", Phase: map[bool]string{true: "ok", false: "fail"}[accepted], Token: 1, Mono: 45e6},
		{Worker: "a", Op: "a-1", Key: "k", Kind: "release", Phase: "invoke", Token: 1, Mono: 46e6},
	}
	log := []Entry{
		{Seq: 1, Op: "b-1", Worker: "b", Kind: "write", Key: "k", Token: 2, Accepted: true, Mono: 33e6},
		{Seq: 2, Op: "a-1", Worker: "a", Kind: "write", Key: "k", Token: 1, Accepted: accepted, Mono: 44e6},
	}
	return &timeline{events: evs, log: log}
}

// The zoomed picture draws the control above the protected run, labels the
// stale holder's write with its token and the database's decision, and
// shows a refusal by the lock where the lock refused.
func TestZoomedLabelsEachDecision(t *testing.T) {
	refused := &timeline{events: []Event{
		{Worker: "a", Op: "a-1", Key: "k", Kind: "acquire", Phase: "invoke", Mono: 1e6},
		{Worker: "a", Op: "a-1", Key: "k", Kind: "acquire", Phase: "fail", Err: fence.ErrNotReplicated.Error(), Mono: 20e6},
		{Worker: "b", Op: "b-1", Key: "k", Kind: "acquire", Phase: "ok", Token: 2, Mono: 25e6},
		{Worker: "b", Op: "b-1", Key: "k", Kind: "write", Phase: "invoke", Token: 2, Mono: 26e6},
		{Worker: "b", Op: "b-1", Key: "k", Kind: "write", Phase: "ok", Token: 2, Mono: 27e6},
		{Worker: "b", Op: "b-1", Key: "k", Kind: "release", Phase: "invoke", Token: 2, Mono: 28e6},
	}, log: []Entry{{Seq: 1, Op: "b-1", Worker: "b", Kind: "write", Key: "k", Token: 2, Accepted: true, Mono: 26.5e6}}}
	rep := &Report{Seed: 7, Quick: true, Results: []Result{
		{Scenario: 1, Name: "paused holder", Config: "control", timeline: staleRound(true)},
		{Scenario: 1, Name: "paused holder", Config: "protected", timeline: staleRound(false)},
		{Scenario: 1, Name: "paused holder", Config: "protected, strict", timeline: refused},
	}}
	var b strings.Builder
	if !rep.Zoomed(&b, 1) {
		t.Fatal("nothing drawn")
	}
	svg := b.String()
	ctl, prot, strict := strings.Index(svg, ">control<"), strings.Index(svg, ">protected<"), strings.Index(svg, ">protected, strict<")
	if ctl < 0 || prot < ctl || strict < prot {
		t.Fatalf("panels out of order (control %d, protected %d, strict %d)", ctl, prot, strict)
	}
	for _, want := range []string{"t1 accepted although stale", "t1 rejected", "lock refused (not replicated)", "a (stale)", "stopped (SIGSTOP)", "seed 7"} {
		if !strings.Contains(svg, want) {
			t.Errorf("picture lacks %q", want)
		}
	}
	if i := strings.Index(svg, "t1 accepted although stale"); i > prot {
		t.Errorf("the stale accept is drawn in the protected panel")
	}
	if rep.Zoomed(&b, 2) {
		t.Error("drew scenario 2, which did not run")
	}
}
