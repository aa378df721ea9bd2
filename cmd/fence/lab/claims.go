package lab

import (
	"fmt"
	"io"
	"strings"
)

// Claim is one claim of the article the lab reproduces, with the figure a
// run measured for it. Figures are computed from the run's results; a
// claim no scenario measures says so.
type Claim struct {
	ID     string `json:"id"`
	Claim  string `json:"claim"`
	Where  string `json:"where"`  // the scenarios and rows the figure comes from
	Figure string `json:"figure"` // what the run measured
	// Shown is "yes" if the run shows the claim, "no" if it contradicts
	// it, "not measured" if no scenario of the lab tests it, "not run"
	// if the scenarios that do were not run.
	Shown string `json:"shown"`
}

// find returns the result of scenario n in config, if it ran.
func (r *Report) find(n int, config string) (Result, bool) {
	for _, res := range r.Results {
		if res.Scenario == n && res.Config == config {
			return res, true
		}
	}
	return Result{}, false
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func pauses(res Result) int {
	n := 0
	for _, c := range res.Interleavings {
		n += c
	}
	return n
}

// Claims computes, per claim of the article, its figure from the results.
func (r *Report) Claims() []Claim {
	var out []Claim
	notRun := func(c Claim) Claim { c.Figure, c.Shown = "scenarios not run", "not run"; return c }

	c := Claim{ID: "C1", Claim: "asynchronous replication and failover can give two holders", Where: "4 control; 4 protected, replica unseen"}
	if ctl, ok := r.find(4, "control"); ok {
		c.Figure = fmt.Sprintf("naive lock: two holders in %d of %d failover rounds (P4 %d overlapping lease pairs), %d leases with a duplicate token",
			ctl.Verdict.TwoHolders, ctl.Verdict.Registers, ctl.Verdict.P4, ctl.Verdict.P2)
		if un, ok := r.find(4, "protected, replica unseen"); ok {
			c.Figure += fmt.Sprintf("; fence's lock, replica never seen: two holders in %d of %d", un.Verdict.TwoHolders, un.Verdict.Registers)
		}
		c.Shown = yes(ctl.Verdict.TwoHolders > 0)
	} else {
		c = notRun(c)
	}
	out = append(out, c)

	c = Claim{ID: "C2", Claim: "Sentinel or Cluster does not remove it", Where: "12 control; 12 protected"}
	if ctl, ok := r.find(12, "control"); ok {
		v := ctl.Verdict
		c.Figure = fmt.Sprintf("Sentinel's own failover (3 sentinels, quorum 2), fence's lock with replica sync off: two holders in %d of %d rounds, %d stale writes accepted by the plain UPDATE, %d leases with a token not above an earlier one's (the token record died with the primary; the promoted node's tokens come from its clock)",
			v.TwoHolders, v.Registers, v.P1, v.P2)
		if p, ok := r.find(12, "protected"); ok {
			c.Figure += fmt.Sprintf("; fence's defaults: lock refused in %d of %d, two holders in %d",
				p.Verdict.Refused, p.Verdict.Registers, p.Verdict.TwoHolders)
		}
		c.Figure += "; Cluster: not measured"
		c.Shown = yes(v.TwoHolders > 0)
	} else {
		c = notRun(c)
	}
	out = append(out, c)

	c = Claim{ID: "C3", Claim: "checking that replicas have the lock narrows the window but does not close it", Where: "4 protected; 5 protected; 5 protected, acks=all"}
	s4, ok4 := r.find(4, "protected")
	s5, ok5 := r.find(5, "protected")
	all, okAll := r.find(5, "protected, acks=all")
	if ok4 || ok5 {
		var parts []string
		if ok4 {
			parts = append(parts, fmt.Sprintf("defaults, replica cut off: lock refused in %d of %d rounds, two holders in %d",
				s4.Verdict.Refused, s4.Verdict.Registers, s4.Verdict.TwoHolders))
		}
		if ok5 {
			parts = append(parts, fmt.Sprintf("defaults, WAIT met by a replica that then died: two holders in %d of %d rounds, lock refused in %d",
				s5.Verdict.TwoHolders, s5.Verdict.Registers, s5.Verdict.Refused))
		}
		if okAll {
			parts = append(parts, fmt.Sprintf("acks=all: lock refused in %d of %d, two holders in %d",
				all.Verdict.Refused, all.Verdict.Registers, all.Verdict.TwoHolders))
		}
		c.Figure = strings.Join(parts, "; ")
		c.Shown = yes(ok4 && ok5 && s4.Verdict.Refused > 0 && s5.Verdict.TwoHolders > 0)
	} else {
		c = notRun(c)
	}
	out = append(out, c)

	c = Claim{ID: "C4", Claim: "a worker paused past its TTL overwrites newer data", Where: "1 control; 3 control"}
	s1, ok1 := r.find(1, "control")
	s3, ok3 := r.find(3, "control")
	if ok1 || ok3 {
		var parts []string
		shown := false
		for _, res := range []struct {
			r  Result
			ok bool
		}{{s1, ok1}, {s3, ok3}} {
			if !res.ok {
				continue
			}
			v := res.r.Verdict
			parts = append(parts, fmt.Sprintf("scenario %d: %d pauses, %d stale writes accepted, %d acknowledged writes lost or doubled",
				res.r.Scenario, pauses(res.r), v.P1, v.P3))
			shown = shown || v.P1 > 0 || v.P3 > 0
		}
		c.Figure, c.Shown = strings.Join(parts, "; "), yes(shown)
	} else {
		c = notRun(c)
	}
	out = append(out, c)

	c = Claim{ID: "C5", Claim: "the resource's token check rejects the stale write", Where: "protected rows (fence's defaults, guard)"}
	rejected, stale, rows := 0, 0, 0
	var per []string
	for _, res := range r.Results {
		if res.Config == "control" {
			continue
		}
		rows++
		rejected += res.Verdict.Rejected
		stale += res.Verdict.P1
		if res.Verdict.Rejected > 0 {
			name := fmt.Sprint(res.Scenario)
			if v := strings.TrimPrefix(res.Config, "protected, "); v != res.Config {
				name += " (" + v + ")"
			}
			per = append(per, fmt.Sprintf("%s: %d", name, res.Verdict.Rejected))
		}
	}
	if rows > 0 {
		c.Figure = fmt.Sprintf("%d stale writes rejected, %d accepted, over %d protected rows", rejected, stale, rows)
		if len(per) > 0 {
			c.Figure += " (rejected per scenario: " + strings.Join(per, ", ") + ")"
		}
		c.Shown = yes(rejected > 0 && stale == 0)
	} else {
		c = notRun(c)
	}
	out = append(out, c)

	c = Claim{ID: "C7", Claim: "the database's conditional update keeps the final state", Where: "protected rows; 3 control"}
	lost, writes, lin := 0, 0, 0
	for _, res := range r.Results {
		if res.Config == "control" {
			continue
		}
		lost += res.Verdict.P3
		writes += res.Verdict.Ops
		if res.Verdict.P5 == "Ok" {
			lin++
		}
	}
	if rows > 0 {
		c.Figure = fmt.Sprintf("guard.Tx (fence, read, write in one transaction): %d of %d writes lost or doubled, P5 Ok in %d of %d protected rows", lost, writes, lin, rows)
		if ok3 {
			c.Figure += fmt.Sprintf("; the control's plain UPDATE in scenario 3: %d lost or doubled of %d, P5 %s", s3.Verdict.P3, s3.Verdict.Ops, s3.Verdict.P5)
		}
		c.Shown = yes(lost == 0 && lin == rows)
	} else {
		c = notRun(c)
	}
	out = append(out, c)

	c = Claim{ID: "C8", Claim: "Redlock rests on timing and does nothing for a stale worker", Where: "7 control; 8 control; 7, 8 protected; 9"}
	s7, ok7 := r.find(7, "control")
	s8, ok8 := r.find(8, "control")
	if ok7 || ok8 {
		var parts []string
		shown := false
		for _, res := range []struct {
			r     Result
			ok    bool
			fault string
		}{{s7, ok7, "a node restarted without persistence"}, {s8, ok8, "a clock jump on one node"}} {
			if !res.ok {
				continue
			}
			v := res.r.Verdict
			parts = append(parts, fmt.Sprintf("%s: two holders in %d of %d rounds, %d stale writes accepted by the plain UPDATE", res.fault, v.TwoHolders, v.Registers, v.P1))
			shown = shown || (v.TwoHolders > 0 && v.P1 > 0)
		}
		rejected, twice, rounds := 0, 0, 0
		for _, n := range []int{7, 8} {
			if p, ok := r.find(n, "protected"); ok {
				rejected += p.Verdict.Rejected
				twice += p.Verdict.TwoHolders
				rounds += p.Verdict.Registers
			}
		}
		if rounds > 0 {
			parts = append(parts, fmt.Sprintf("with guard: two holders in %d of %d rounds, %d stale writes rejected by the token", twice, rounds, rejected))
		}
		if p, ok := r.find(9, "protected"); ok {
			part := fmt.Sprintf("3 nodes, a pause inside Acquire longer than the lease: %d acquisitions refused by the validity check, %d expired grants", p.Verdict.Refused, p.Verdict.Expired)
			if ctl, ok := r.find(9, "control"); ok {
				part += fmt.Sprintf(" (the naive lock: %d)", ctl.Verdict.Expired)
			}
			parts = append(parts, part)
		}
		c.Figure, c.Shown = "fence's redlock with its defaults; 5 nodes, "+strings.Join(parts, "; "), yes(shown)
	} else {
		c = notRun(c)
	}
	out = append(out, c)
	return out
}

// claimsMarkdown writes the claims as a Markdown table.
func (r *Report) claimsMarkdown(w io.Writer) {
	fmt.Fprintln(w, "| claim | the article says | measured in | figure | shown |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, c := range r.Claims() {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", c.ID, c.Claim, c.Where, c.Figure, c.Shown)
	}
}
