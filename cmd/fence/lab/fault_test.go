package lab

import (
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

// A failover round in which B had to wait out A's lease on the promoted
// node did not lose the lock: noted. A refused acquisition, or B getting
// the lock at once, is a fault that bit.
func TestCheckFailoverNotesALockThatSurvived(t *testing.T) {
	a, b := Spec{ID: "A0", TTL: 5 * time.Second}, Spec{ID: "B0"}
	ms := int64(time.Millisecond)
	cases := []struct {
		name   string
		events []Event
		noted  bool
	}{
		{"B waited out A's lease", []Event{
			{Worker: "A0", Kind: "acquire", Phase: "ok", Mono: 1},
			{Worker: "B0", Kind: "acquire", Phase: "invoke", Mono: 10 * ms},
			{Worker: "B0", Kind: "acquire", Phase: "ok", Mono: 4000 * ms},
		}, true},
		{"B got the lock at once", []Event{
			{Worker: "A0", Kind: "acquire", Phase: "ok", Mono: 1},
			{Worker: "B0", Kind: "acquire", Phase: "invoke", Mono: 10 * ms},
			{Worker: "B0", Kind: "acquire", Phase: "ok", Mono: 12 * ms},
		}, false},
		{"A refused", []Event{
			{Worker: "A0", Kind: "acquire", Phase: "fail", Mono: 1},
			{Worker: "B0", Kind: "acquire", Phase: "invoke", Mono: 10 * ms},
			{Worker: "B0", Kind: "acquire", Phase: "ok", Mono: 4000 * ms},
		}, false},
		{"B never got it", []Event{
			{Worker: "A0", Kind: "acquire", Phase: "ok", Mono: 1},
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
