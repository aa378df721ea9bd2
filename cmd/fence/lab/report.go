package lab

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Report is the outcome of a lab run.
type Report struct {
	Date     string   `json:"date"`
	Machine  string   `json:"machine"`
	Versions []string `json:"versions"`
	Quick    bool     `json:"quick"`
	Seed     uint64   `json:"seed"` // replay with fence lab --seed
	Results  []Result `json:"results"`
	// ClaimFigures are the article's claims with their figures (Claims),
	// filled in when the report is written.
	ClaimFigures []Claim `json:"claims"`
}

func newReport(quick bool) *Report {
	r := &Report{Date: time.Now().UTC().Format("2006-01-02 15:04 MST"), Quick: quick,
		Machine: fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU())}
	r.Versions = append(r.Versions, runtime.Version())
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		r.Versions = append(r.Versions, strings.TrimSpace(string(out)))
	}
	if out, err := exec.Command("uname", "-sr").Output(); err == nil {
		r.Machine += ", " + strings.TrimSpace(string(out))
	}
	return r
}

// Passed reports whether every control showed its violation and every
// protected run showed none.
func (r *Report) Passed() bool {
	for _, res := range r.Results {
		if !res.Pass {
			return false
		}
	}
	return len(r.Results) > 0
}

func (res Result) line() string {
	v := res.Verdict
	mark := "ok  "
	if !res.Pass {
		mark = "FAIL"
	}
	line := fmt.Sprintf("%s scenario %-2d %-24s %-26s writes %4d  P1 %3d  P2 %3d  P3 %3d  P4 %3d  P5 %-8s refused %2d rejected %3d retried %2d %5.1fs  (expect %s; P5 histories %s)",
		mark, res.Scenario, res.Name, res.Config, v.Ops, v.P1, v.P2, v.P3, v.P4, v.P5, v.Refused, v.Rejected, v.Retried, res.Seconds, res.Expect, p5Sizes(v.P5Histories))
	if v.Messages > 0 {
		line += fmt.Sprintf(" messages %d doubled %d lost %d", v.Messages, v.Doubled, v.Lost)
	}
	if strings.Contains(res.Expect, "expired grants") {
		line += fmt.Sprintf(" expired grants %d", v.Expired)
	}
	if res.FaultNote != "" {
		line += "\n     FAULT DID NOT TAKE EFFECT: " + res.FaultNote
	}
	return line
}

// Markdown writes the report as a Markdown table with the first violations
// of each run.
func (r *Report) Markdown(w io.Writer) {
	mode := "full run"
	if r.Quick {
		mode = "quick run"
	}
	fmt.Fprintf(w, "Fault lab, %s, %s, seed %d (replay: fence lab --seed %d). Machine: %s. Versions: %s.\n\n",
		mode, r.Date, r.Seed, r.Seed, r.Machine, strings.Join(r.Versions, "; "))
	fmt.Fprintln(w, "| # | scenario | config | writes | P1 stale accepts | P2 token order | P3 lost or doubled | P4 lease overlaps | P5 linearizable | P5 histories checked | lock refused | token rejected | seconds | expected | pass |")
	fmt.Fprintln(w, "|---|---|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---|---|")
	for _, res := range r.Results {
		v := res.Verdict
		pass := "yes"
		if !res.Pass {
			pass = "**NO**"
		}
		fmt.Fprintf(w, "| %d | %s | %s | %d | %d | %d | %d | %d | %s | %s | %d | %d | %.1f | %s | %s |\n",
			res.Scenario, res.Name, res.Config, v.Ops, v.P1, v.P2, v.P3, v.P4, v.P5, p5Sizes(v.P5Histories), v.Refused, v.Rejected, res.Seconds, res.Expect, pass)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "The article's claims, with this run's figures:")
	fmt.Fprintln(w)
	r.claimsMarkdown(w)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "C7 is guard's fenced read-modify-write; the article's conditional UPDATE alone, with the row read outside the transaction, loses updates (the lab's mutation test TestMutationTokenOnlyFailsP3). A \"two holders\" round is a register on which two leases overlapped.")
	fmt.Fprintln(w)
	for _, res := range r.Results {
		if len(res.Verdict.Examples) == 0 && res.FaultNote == "" && len(res.Interleavings) == 0 && res.Verdict.Retried == 0 {
			continue
		}
		fmt.Fprintf(w, "- scenario %d, %s:", res.Scenario, res.Config)
		if res.FaultNote != "" {
			fmt.Fprintf(w, " **fault did not take effect**: %s;", res.FaultNote)
		}
		if len(res.Interleavings) > 0 {
			names := make([]string, 0, len(res.Interleavings))
			for n := range res.Interleavings {
				names = append(names, n)
			}
			sort.Strings(names)
			fmt.Fprint(w, " stale holder resumed at:")
			for _, n := range names {
				fmt.Fprintf(w, " %s ×%d,", n, res.Interleavings[n])
			}
			fmt.Fprint(w, ";")
		}
		if res.Verdict.Retried > 0 {
			fmt.Fprintf(w, " writes given up for a conflict (guard.ErrRetry), retried with a new lease ×%d;", res.Verdict.Retried)
		}
		for _, ex := range res.Verdict.Examples {
			fmt.Fprintf(w, " %s;", ex)
		}
		fmt.Fprintln(w)
	}
}

// JSON writes the report as JSON.
func (r *Report) JSON(w io.Writer) error {
	r.ClaimFigures = r.Claims()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Timeline writes an SVG picture of one run: the first control run, where
// the failure shows. It returns false if there is none.
func (r *Report) Timeline(w io.Writer) bool {
	for _, res := range r.Results {
		if res.Config == "control" && res.timeline != nil {
			res.timeline.svg(w, fmt.Sprintf("Scenario %d, %s, %s", res.Scenario, res.Name, res.Config))
			return true
		}
	}
	return false
}
