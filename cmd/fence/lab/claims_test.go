package lab

import (
	"strings"
	"testing"
)

// result builds a Result of scenario n in config with verdict v.
func result(n int, config string, v Verdict) Result {
	return Result{Scenario: n, Config: config, Verdict: v}
}

// The claims table is computed from the results: the figures carry the
// results' numbers, a claim whose scenario showed nothing says "no", a
// claim no scenario measures says "not measured", and one whose scenarios
// did not run says "not run".
func TestClaimsComeFromTheResults(t *testing.T) {
	shows := &Report{Results: []Result{
		result(1, "control", Verdict{Ops: 41, P1: 4, P3: 3}),
		result(1, "protected", Verdict{Ops: 262, Rejected: 7, P5: "Ok"}),
		result(3, "control", Verdict{Ops: 45, P3: 5, P5: "Illegal (rmw)"}),
		result(4, "control", Verdict{Registers: 2, TwoHolders: 2, P4: 20, P2: 2}),
		result(4, "protected", Verdict{Registers: 2, Refused: 2, P5: "Ok"}),
		result(4, "protected, replica unseen", Verdict{Registers: 2, TwoHolders: 2, Rejected: 2, P5: "Ok"}),
		result(5, "protected", Verdict{Registers: 2, TwoHolders: 2, Rejected: 2, P5: "Ok"}),
		result(5, "protected, acks=all", Verdict{Registers: 2, Refused: 2, P5: "Ok"}),
		result(12, "control", Verdict{Registers: 3, TwoHolders: 3, P4: 60, P1: 3}),
		result(12, "protected", Verdict{Registers: 3, Refused: 3, P5: "Ok"}),
		result(7, "control", Verdict{Registers: 2, TwoHolders: 2, P1: 2}),
		result(7, "protected", Verdict{Registers: 2, TwoHolders: 2, Rejected: 2, P5: "Ok"}),
		result(8, "control", Verdict{Registers: 1, TwoHolders: 1, P1: 1}),
		result(9, "control", Verdict{Registers: 1, Expired: 1}),
		result(9, "protected", Verdict{Registers: 1, Refused: 1, P5: "Ok"}),
	}}
	want := map[string]struct{ shown, figure string }{
		"C1": {"yes", "two holders in 2 of 2 failover rounds (P4 20"},
		"C2": {"yes", "replica sync off: two holders in 3 of 3 rounds, 3 stale writes accepted by the plain UPDATE, 0 leases with a token not above an earlier one's (the token record died with the primary; the promoted node's tokens come from its clock); fence's defaults: lock refused in 3 of 3, two holders in 0; Cluster: not measured"},
		"C3": {"yes", "WAIT met by a replica that then died: two holders in 2 of 2 rounds"},
		"C4": {"yes", "scenario 1: 0 pauses, 4 stale writes accepted, 3 acknowledged"},
		"C5": {"yes", "13 stale writes rejected, 0 accepted, over 8 protected rows (rejected per scenario: 1: 7, 4 (replica unseen): 2, 5: 2, 7: 2)"},
		"C7": {"yes", "0 of 262 writes lost or doubled, P5 Ok in 8 of 8"},
		"C8": {"yes", "a node restarted without persistence: two holders in 2 of 2 rounds, 2 stale writes accepted by the plain UPDATE; a clock jump on one node: two holders in 1 of 1 rounds, 1 stale writes accepted by the plain UPDATE; with guard: two holders in 2 of 2 rounds, 2 stale writes rejected by the token; 3 nodes, a pause inside Acquire longer than the lease: 1 acquisitions refused by the validity check, 0 expired grants (the naive lock: 1)"},
	}
	check := func(rep *Report, want map[string]struct{ shown, figure string }) {
		t.Helper()
		cs := rep.Claims()
		if len(cs) != len(want) {
			t.Fatalf("%d claims, want %d: %+v", len(cs), len(want), cs)
		}
		for _, c := range cs {
			w := want[c.ID]
			if c.Shown != w.shown || !strings.Contains(c.Figure, w.figure) {
				t.Errorf("%s: shown %q, figure %q; want %q, a figure with %q", c.ID, c.Shown, c.Figure, w.shown, w.figure)
			}
		}
	}
	check(shows, want)

	// The same rows where nothing happened: the claims are not shown.
	quiet := &Report{Results: []Result{
		result(1, "control", Verdict{Ops: 41}),
		result(1, "protected", Verdict{Ops: 262, P1: 1, P3: 1, P5: "Illegal (rmw)"}),
		result(3, "control", Verdict{Ops: 45, P5: "Ok"}),
		result(4, "control", Verdict{Registers: 2}),
		result(4, "protected", Verdict{Registers: 2, TwoHolders: 2, P5: "Ok"}),
		result(5, "protected", Verdict{Registers: 2, Refused: 2, P5: "Ok"}),
		result(12, "control", Verdict{Registers: 3}),
		result(12, "protected", Verdict{Registers: 3, TwoHolders: 3, P5: "Ok"}),
		result(7, "control", Verdict{Registers: 2}),
	}}
	check(quiet, map[string]struct{ shown, figure string }{
		"C1": {"no", "two holders in 0 of 2"},
		"C2": {"no", "two holders in 0 of 3 rounds"},
		"C3": {"no", "lock refused in 0 of 2 rounds, two holders in 2"},
		"C4": {"no", "0 stale writes accepted, 0 acknowledged"},
		"C5": {"no", "0 stale writes rejected, 1 accepted"},
		"C7": {"no", "1 of 262 writes lost or doubled, P5 Ok in 3 of 4"},
		"C8": {"no", "a node restarted without persistence: two holders in 0 of 2 rounds, 0 stale writes accepted"},
	})

	// Only scenario 6: the claims of the others were not run.
	only6 := &Report{Results: []Result{result(6, "control", Verdict{P2: 3})}}
	for _, c := range only6.Claims() {
		if c.Shown != "not run" {
			t.Errorf("%s with only scenario 6's control: shown %q, want not run", c.ID, c.Shown)
		}
	}
}
