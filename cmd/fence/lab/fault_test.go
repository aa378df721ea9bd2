package lab

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func experimentWith(events ...Event) *experiment {
	x := &experiment{hist: newHistory()}
	for _, e := range events {
		x.hist.add(e)
	}
	return x
}

// A restart that came after the workers' last acquisition did not bite
// (scenario 6 in ci41: P2 = 0 in its control, no fault noted).
func TestTakenAfter(t *testing.T) {
	x := experimentWith(
		Event{Worker: "w1", Op: "w1-1", Kind: "acquire", Phase: "invoke", Mono: 10},
		Event{Worker: "w1", Op: "w1-1", Kind: "acquire", Phase: "ok", Mono: 20},
		Event{Worker: "w2", Op: "w2-1", Kind: "acquire", Phase: "fail", Mono: 40},
	)
	if !x.takenAfter(15) {
		t.Error("takenAfter(15) = false, want true: w1 took the lock at 20")
	}
	if x.takenAfter(20) {
		t.Error("takenAfter(20) = true, want false: only a failed acquisition came after")
	}
}

// A delayed write that completed before anyone else took the lock did not
// bite, and is noted (which fails the run); one that completed after
// another lease began is not.
func TestCheckOverlappedNotesAFaultThatDidNotBite(t *testing.T) {
	x := experimentWith(
		Event{Worker: "w1", Op: "w1-1", Kind: "acquire", Phase: "ok", Mono: 10},
		Event{Worker: "w1", Op: "w1-1", Kind: "write", Phase: "ok", Mono: 20},
		Event{Worker: "w2", Op: "w2-1", Kind: "acquire", Phase: "ok", Mono: 30},
	)
	x.checkOverlapped("w1")
	if !strings.Contains(x.note, "did not bite") {
		t.Fatalf("note = %q, want a fault that did not bite", x.note)
	}
	x = experimentWith(
		Event{Worker: "w1", Op: "w1-1", Kind: "acquire", Phase: "ok", Mono: 10},
		Event{Worker: "w2", Op: "w2-1", Kind: "acquire", Phase: "ok", Mono: 15},
		Event{Worker: "w1", Op: "w1-1", Kind: "write", Phase: "fail", Mono: 20},
	)
	x.checkOverlapped("w1")
	if x.note != "" {
		t.Fatalf("note = %q for a delayed write that bit", x.note)
	}
}

// A failover round in which B was granted the lock only a lease time after
// A asked for it (B waited out A's lease on the promoted node) did not
// lose the lock: noted. A refused acquisition, or B granted within A's
// lease (at once, or late after tries that missed), is a fault that bit.
func TestCheckFailoverNotesALockThatSurvived(t *testing.T) {
	a, b := Spec{ID: "A0", TTL: 5 * time.Second}, Spec{ID: "B0"}
	ms := int64(time.Millisecond)
	cases := []struct {
		name   string
		events []Event
		noted  bool
	}{
		{"B waited out A's lease", []Event{
			{Worker: "A0", Kind: "acquire", Phase: "invoke", Mono: 1},
			{Worker: "A0", Kind: "acquire", Phase: "ok", Mono: 2 * ms},
			{Worker: "B0", Kind: "acquire", Phase: "invoke", Mono: 10 * ms},
			{Worker: "B0", Kind: "acquire", Phase: "ok", Mono: 5001 * ms},
		}, true},
		{"B got the lock at once", []Event{
			{Worker: "A0", Kind: "acquire", Phase: "invoke", Mono: 1},
			{Worker: "A0", Kind: "acquire", Phase: "ok", Mono: 2 * ms},
			{Worker: "B0", Kind: "acquire", Phase: "invoke", Mono: 10 * ms},
			{Worker: "B0", Kind: "acquire", Phase: "ok", Mono: 12 * ms},
		}, false},
		// ci51: B's first tries missed on a loaded machine; granted
		// inside A's lease all the same.
		{"B got the lock late, inside A's lease", []Event{
			{Worker: "A0", Kind: "acquire", Phase: "invoke", Mono: 1},
			{Worker: "A0", Kind: "acquire", Phase: "ok", Mono: 2 * ms},
			{Worker: "B0", Kind: "acquire", Phase: "invoke", Mono: 10 * ms},
			{Worker: "B0", Kind: "acquire", Phase: "ok", Mono: 4990 * ms},
		}, false},
		{"A refused", []Event{
			{Worker: "A0", Kind: "acquire", Phase: "invoke", Mono: 1},
			{Worker: "A0", Kind: "acquire", Phase: "fail", Mono: 2 * ms},
			{Worker: "B0", Kind: "acquire", Phase: "invoke", Mono: 10 * ms},
			{Worker: "B0", Kind: "acquire", Phase: "ok", Mono: 4000 * ms},
		}, false},
		{"B never got it", []Event{
			{Worker: "A0", Kind: "acquire", Phase: "invoke", Mono: 1},
			{Worker: "A0", Kind: "acquire", Phase: "ok", Mono: 2 * ms},
			{Worker: "B0", Kind: "acquire", Phase: "invoke", Mono: 10 * ms},
		}, true},
	}
	for _, c := range cases {
		x := experimentWith(c.events...)
		x.checkFailover(a, b)
		if got := x.note != ""; got != c.noted {
			t.Errorf("%s: note %q, want noted %v", c.name, x.note, c.noted)
		}
	}
}

// A run whose fault did not take effect fails, control or protected, even
// when its verdict is what was expected.
func TestAFaultThatDidNotBiteFailsTheRun(t *testing.T) {
	clean := Verdict{Ops: 10, P5: "Ok"}
	violated := Verdict{Ops: 10, P1: 3, P5: "Ok"}
	for _, c := range []struct {
		protected bool
		v         Verdict
		note      string
		pass      bool
	}{
		{true, clean, "", true},
		{true, clean, "fault did not bite", false},
		{true, violated, "", false},
		{false, violated, "", true},
		{false, violated, "fault did not bite", false},
		{false, clean, "", false},
	} {
		if _, pass := judge(c.protected, "P1", c.v, c.note); pass != c.pass {
			t.Errorf("protected %v, %+v, note %q: pass %v, want %v", c.protected, c.v, c.note, pass, c.pass)
		}
	}
}

// The same seed draws the same resume points, in the order of the pauses:
// what --seed replays.
func TestSeedReplaysResumePoints(t *testing.T) {
	draws := func(seed uint64) []int {
		x := &experiment{rng: rand.New(rand.NewPCG(seed, 17))}
		var out []int
		for range 20 {
			p, d := x.draw()
			out = append(out, p, int(d))
		}
		return out
	}
	if a, b := draws(7), draws(7); !slices.Equal(a, b) {
		t.Fatalf("seed 7 drew %v, then %v", a, b)
	}
	if a, b := draws(7), draws(8); slices.Equal(a, b) {
		t.Fatalf("seeds 7 and 8 drew the same %v", a)
	}
}
