package lab

import (
	"os"
	"testing"

	"github.com/fencekit/fence/internal/testmain"
)

// TestMain makes the temp dir the tests' one build of the worker goes
// into (see runLab), and removes it after the tests.
func TestMain(m *testing.M) {
	testmain.Run(m, func() (func(), error) {
		dir, err := os.MkdirTemp("", "fence-lab-test-worker-")
		if err != nil {
			return nil, err
		}
		workerDir = dir
		return func() { os.RemoveAll(dir) }, nil
	})
}

// history builds events for leases given as (worker, op, token, t0..t3):
// acquire invoked at t0, acquired at t1, write at t2, release at t3.
func history(leases ...[7]any) []Event {
	var evs []Event
	for _, l := range leases {
		w, op, tok := l[0].(string), l[1].(string), int64(l[2].(int))
		t0, t1, t2, t3 := int64(l[3].(int)), int64(l[4].(int)), int64(l[5].(int)), int64(l[6].(int))
		evs = append(evs,
			Event{Worker: w, Op: op, Key: "k", Kind: "acquire", Phase: "invoke", Mono: t0},
			Event{Worker: w, Op: op, Key: "k", Kind: "acquire", Phase: "ok", Token: tok, Mono: t1},
			Event{Worker: w, Op: op, Key: "k", Kind: "write", Phase: "invoke", Token: tok, Mono: t2},
			Event{Worker: w, Op: op, Key: "k", Kind: "write", Phase: "ok", Token: tok, Mono: t2 + 1},
			Event{Worker: w, Op: op, Key: "k", Kind: "release", Phase: "invoke", Token: tok, Mono: t3},
		)
	}
	return evs
}

func TestCheckSeesEachViolation(t *testing.T) {
	// a: token 1, held 0..50; b: token 2, acquired at 20 while a still held.
	events := history([7]any{"a", "a-1", 1, 0, 1, 40, 50}, [7]any{"b", "b-1", 2, 10, 20, 30, 35})
	log := []Entry{
		{Seq: 1, Op: "b-1", Worker: "b", Kind: "write", Key: "k", Token: 2, Accepted: true},
		{Seq: 2, Op: "a-1", Worker: "a", Kind: "write", Key: "k", Token: 1, Accepted: true}, // stale, accepted
	}
	state := map[string][]string{"k": {"a-1"}} // b's acknowledged write is lost
	v := Check(events, log, state)
	if v.P1 != 1 || v.P3 != 1 || v.P4 != 1 || v.P2 != 0 || v.Ops != 2 {
		t.Fatalf("verdict %+v, want P1 1, P3 1, P4 1, P2 0, 2 writes", v)
	}
	if v.Registers != 1 || v.TwoHolders != 1 {
		t.Fatalf("verdict %+v, want two holders on 1 of 1 registers", v)
	}

	// Token order: c completes with token 5 before d begins; d gets 5 again.
	events = history([7]any{"c", "c-1", 5, 0, 1, 2, 3}, [7]any{"d", "d-1", 5, 10, 11, 12, 13})
	log = []Entry{
		{Seq: 1, Op: "c-1", Worker: "c", Kind: "write", Key: "k", Token: 5, Accepted: true},
		{Seq: 2, Op: "d-1", Worker: "d", Kind: "write", Key: "k", Token: 5, Accepted: true},
	}
	v = Check(events, log, map[string][]string{"k": {"c-1", "d-1"}})
	if v.P2 != 1 || v.P1 != 0 || v.P3 != 0 || v.P4 != 0 {
		t.Fatalf("verdict %+v, want only P2 1", v)
	}
	if got, _ := checkLinearizable(events); got != "Illegal (tokens)" {
		t.Fatalf("P5 for a repeated token = %q, want Illegal (tokens)", got)
	}
}

func TestCheckCleanHistory(t *testing.T) {
	events := history([7]any{"a", "a-1", 1, 0, 1, 2, 3}, [7]any{"b", "b-1", 2, 1, 4, 5, 6})
	// Reads that saw what was written, for P5's register.
	events = append(events,
		Event{Worker: "a", Op: "a-1", Key: "k", Kind: "read", Phase: "invoke", Mono: 1},
		Event{Worker: "a", Op: "a-1", Key: "k", Kind: "read", Phase: "ok", Mono: 2},
	)
	events[2].Value, events[8].Value = []string{"a-1"}, []string{"a-1", "b-1"}
	log := []Entry{
		{Seq: 1, Op: "a-1", Worker: "a", Kind: "write", Key: "k", Token: 1, Accepted: true},
		{Seq: 2, Op: "b-1", Worker: "b", Kind: "write", Key: "k", Token: 2, Accepted: true},
		{Seq: 3, Op: "x", Worker: "a", Kind: "write", Key: "k", Token: 1, Accepted: false},
	}
	v := Check(events, log, map[string][]string{"k": {"a-1", "b-1"}})
	if v.P1+v.P2+v.P3+v.P4 != 0 || v.TwoHolders != 0 || v.Registers != 1 {
		t.Fatalf("clean history judged %+v", v)
	}
	if got, _ := checkLinearizable(events); got != "Ok" {
		t.Fatalf("P5 = %q, want Ok", got)
	}
}

// rw is one read or write of register k by worker w, invoked at call and
// returned at ret, with the value it wrote or read.
func rw(w, op, kind string, call, ret int64, value ...string) []Event {
	return []Event{
		{Worker: w, Op: op, Key: "k", Kind: kind, Phase: "invoke", Value: map[bool][]string{true: value}[kind == "write"], Mono: call},
		{Worker: w, Op: op, Key: "k", Kind: kind, Phase: "ok", Value: value, Mono: ret},
	}
}

// P5's register model can fail: a read that returns a value which was
// overwritten before the read was invoked (a stale replica or cache would
// do this) is Illegal; the same read invoked before the overwrite is Ok.
func TestP5RegisterSeesAStaleRead(t *testing.T) {
	for _, c := range []struct {
		readAt int64
		want   string
	}{{5, "Ok"}, {30, "Illegal (register)"}} {
		var evs []Event
		evs = append(evs, rw("a", "a-1", "write", 0, 2, "x")...)
		evs = append(evs, rw("b", "b-1", "write", 10, 20, "y")...)
		evs = append(evs, rw("c", "c-1", "read", c.readAt, c.readAt+25, "x")...)
		got, hs := checkLinearizable(evs)
		if got != c.want {
			t.Errorf("read of an overwritten value invoked at %d: P5 %q, want %q", c.readAt, got, c.want)
		}
		if len(hs) != 1 || hs[0].Model != "register" || hs[0].Ops != 3 || hs[0].Result != map[bool]string{true: "Ok", false: "Illegal"}[c.want == "Ok"] {
			t.Errorf("histories checked: %+v, want one register history of 3 ops", hs)
		}
	}
}

// rmwLease is one lease's read-modify-write as a worker records it: read
// invoked at call, returned what, the write of what+op acknowledged at ret.
func rmwLease(w, op string, call, readAt, ret int64, read ...string) []Event {
	written := append(append([]string(nil), read...), op)
	return []Event{
		{Worker: w, Op: op, Key: "k", Kind: "read", Phase: "invoke", Mono: call},
		{Worker: w, Op: op, Key: "k", Kind: "read", Phase: "ok", Value: read, Mono: readAt},
		{Worker: w, Op: op, Key: "k", Kind: "write", Phase: "invoke", Value: written, Mono: readAt + 1},
		{Worker: w, Op: op, Key: "k", Kind: "write", Phase: "ok", Value: written, Mono: ret},
	}
}

// P5's rmw model can fail: two leases that both read [] and both had their
// write acknowledged (a lost update) are Illegal, although the same
// history is a legal register (a store that accepts a late blind write is
// linearizable). The second lease reading the first's write is Ok; a
// rejected write and a write of unknown outcome that did not land are Ok.
func TestP5RMWSeesALostUpdate(t *testing.T) {
	lost := append(rmwLease("a", "a-1", 0, 1, 30), rmwLease("b", "b-1", 2, 3, 10)...)
	if got, _ := checkLinearizable(lost); got != "Illegal (rmw)" {
		t.Errorf("lost update: P5 %q, want Illegal (rmw)", got)
	}
	serial := append(rmwLease("a", "a-1", 0, 1, 2), rmwLease("b", "b-1", 3, 4, 5, "a-1")...)
	if got, _ := checkLinearizable(serial); got != "Ok" {
		t.Errorf("serial leases: P5 %q, want Ok", got)
	}
	rejected := rmwLease("a", "a-1", 0, 1, 30)
	rejected[3].Phase = "fail"
	rejected = append(rejected, rmwLease("b", "b-1", 2, 3, 10)...)
	if got, _ := checkLinearizable(rejected); got != "Ok" {
		t.Errorf("stale write rejected: P5 %q, want Ok", got)
	}
	unknown := rmwLease("a", "a-1", 0, 1, 30)
	unknown[3].Phase = "unknown"
	unknown = append(unknown, rmwLease("b", "b-1", 2, 3, 10)...)
	unknown = append(unknown, rmwLease("c", "c-1", 40, 41, 42, "b-1")...)
	if got, _ := checkLinearizable(unknown); got != "Ok" {
		t.Errorf("write of unknown outcome that did not land: P5 %q, want Ok", got)
	}
}

// An expired grant is a lease returned by an acquisition that was paused
// inside Acquire while another worker took the lock; a pause after the
// acquisition (scenario 1's), or one during which nobody took the lock, is
// none.
func TestCheckCountsExpiredGrants(t *testing.T) {
	acq := func(w, op string, invoke, ok int64) []Event {
		return []Event{
			{Worker: w, Op: op, Key: "k", Kind: "acquire", Phase: "invoke", Mono: invoke},
			{Worker: w, Op: op, Key: "k", Kind: "acquire", Phase: "ok", Token: ok, Mono: ok},
		}
	}
	pause := func(w, op string, at int64) Event {
		return Event{Worker: w, Op: op, Key: "k", Kind: "pause", Phase: "invoke", Mono: at}
	}
	cases := []struct {
		name   string
		events []Event
		want   int
	}{
		{"paused inside Acquire, B took the lock", append(append([]Event{}, acq("A", "A-1", 10, 50)[0], pause("A", "A-1", 12)),
			append(acq("B", "B-1", 20, 30), acq("A", "A-1", 10, 50)[1])...), 1},
		{"paused inside Acquire, nobody took it", []Event{acq("A", "A-1", 10, 50)[0], pause("A", "A-1", 12), acq("A", "A-1", 10, 50)[1]}, 0},
		{"paused after Acquire", append(append(acq("A", "A-1", 10, 11), pause("A", "A-1", 12)), acq("B", "B-1", 20, 30)...), 0},
	}
	for _, c := range cases {
		if v := Check(c.events, nil, nil); v.Expired != c.want {
			t.Errorf("%s: Expired = %d, want %d (%v)", c.name, v.Expired, c.want, v.Examples)
		}
	}
}
