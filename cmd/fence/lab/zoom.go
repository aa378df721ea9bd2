package lab

import (
	"fmt"
	"html"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/fencekit/fence"
)

// panel is one run's round, ready to draw: its events and log entries
// between from and to (monotonic ns), and the time zero of the shared axis.
type panel struct {
	title    string
	events   []Event
	log      []Entry
	zero     int64
	from, to int64
	focus    string // the stale holder's op
}

// round picks the round of a run worth looking at: the lease of the stale
// holder (whose write the resource accepted although stale, else rejected,
// else the first paused one, else the first lease), from its acquisition to
// the outcome of its write, with 10% either side. Zero is its acquisition.
func (tl *timeline) round() (panel, bool) {
	if tl == nil || len(tl.events) == 0 {
		return panel{}, false
	}
	var focus string
	var rejected string
	before := acceptedBefore(tl.log)
	for i, e := range tl.log {
		if e.Accepted && e.Token < before[i] && focus == "" {
			focus = e.Op
		}
		if !e.Accepted && rejected == "" {
			rejected = e.Op
		}
	}
	if focus == "" {
		focus = rejected
	}
	if focus == "" {
		// The lock refused the stale holder: from its attempt to the
		// first write of another worker on the same register after it.
		for i, e := range tl.events {
			if e.Kind == "acquire" && e.Phase == "fail" && refusedByLock(e.Err) {
				var start int64
				for _, c := range tl.events[:i] {
					if c.Op == e.Op && c.Kind == "acquire" && c.Phase == "invoke" {
						start = c.Mono
					}
				}
				end := e.Mono
				for _, o := range tl.events {
					if o.Worker != e.Worker && o.Key == e.Key && o.Kind == "write" && o.Phase != "invoke" && o.Mono > e.Mono {
						end = o.Mono
						break
					}
				}
				if start == 0 || end <= start {
					break
				}
				margin := (end - start) / 10
				return panel{events: tl.events, log: tl.log, zero: start, from: start - margin, to: end + margin, focus: e.Op}, true
			}
		}
		for _, e := range tl.events {
			if e.Kind == "pause" {
				focus = e.Op
				break
			}
		}
	}
	if focus == "" {
		for _, e := range tl.events {
			if e.Kind == "acquire" && e.Phase == "ok" {
				focus = e.Op
				break
			}
		}
	}
	var start, end, invoke int64
	pausedInAcquire := false
	for _, e := range tl.events {
		if e.Op != focus {
			continue
		}
		switch {
		case e.Kind == "acquire" && e.Phase == "invoke":
			invoke = e.Mono
		case e.Kind == "pause" && start == 0:
			pausedInAcquire = true // paused inside Acquire (scenario 9)
		case e.Kind == "acquire" && e.Phase == "ok":
			start = e.Mono
		case e.Kind == "write" && e.Phase != "invoke":
			end = e.Mono
		}
	}
	if pausedInAcquire && invoke != 0 {
		// From the attempt: the other holder's lease lies inside the pause.
		start = invoke
	}
	for _, l := range tl.log {
		if l.Op == focus {
			end = max(end, l.Mono)
		}
	}
	if start == 0 || end <= start {
		return panel{}, false
	}
	margin := (end - start) / 10
	return panel{events: tl.events, log: tl.log, zero: start, from: start - margin, to: end + margin, focus: focus}, true
}

// shortToken writes a token for a label: in full up to six digits, else
// its last six (the full one is in the tooltip).
func shortToken(t int64) string {
	if t < 1e6 {
		return fmt.Sprint(t)
	}
	return fmt.Sprintf("…%06d", t%1e6)
}

// Zoomed writes an SVG picture of one round of scenario n: one panel per
// configuration, the control on top, on one time axis (ms from the stale
// holder's acquisition): who held the lease when (blue bars, labelled with
// their tokens), the stale holder's pause (grey), and each write where the
// resource decided it: accepted, rejected, or accepted although stale. It
// returns false if the scenario has no run to draw.
func (r *Report) Zoomed(w io.Writer, n int) bool {
	var panels []panel
	name := ""
	for _, res := range r.Results {
		if res.Scenario != n {
			continue
		}
		p, ok := res.timeline.round()
		if !ok {
			continue
		}
		name = res.Name
		p.title = res.Config
		panels = append(panels, p)
	}
	if len(panels) == 0 {
		return false
	}
	// One axis: from the earliest start to the latest end, relative to zero.
	lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
	rowsOf := make([][]string, len(panels))
	for i, p := range panels {
		lo, hi = min(lo, p.from-p.zero), max(hi, p.to-p.zero)
		seen := map[string]bool{}
		for _, e := range p.events {
			if e.Mono >= p.from && e.Mono <= p.to && !seen[e.Worker] {
				seen[e.Worker] = true
				rowsOf[i] = append(rowsOf[i], e.Worker)
			}
		}
		sort.Strings(rowsOf[i])
	}
	const left, width, rowH, head = 110, 1100, 30, 26
	x := func(rel int64) float64 { return left + float64(rel-lo)/float64(hi-lo)*float64(width-left-30) }
	height := 40
	for i := range panels {
		height += head + rowH*len(rowsOf[i]) + 14
	}
	height += 60
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/><text x="10" y="20" font-size="14" font-weight="bold">Scenario %d, %s: one round, control above protected (%s, seed %d)</text>`+"\n",
		n, html.EscapeString(name), map[bool]string{true: "quick run", false: "full run"}[r.Quick], r.Seed)
	// Time grid.
	step := niceStep(float64(hi-lo) / 1e6 / 8)
	gridTop, gridBottom := 30, height-50
	for ms := math.Ceil(float64(lo)/1e6/step) * step; ms <= float64(hi)/1e6; ms += step {
		gx := x(int64(ms * 1e6))
		label := ms
		if math.Abs(label) < step/1e3 {
			label = 0 // not "-0"
		}
		fmt.Fprintf(w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/><text x="%.1f" y="%d" text-anchor="middle" fill="#555">%g ms</text>`+"\n",
			gx, gridTop, gx, gridBottom, gx, gridBottom+14, label)
	}
	y := 40
	for i, p := range panels {
		fmt.Fprintf(w, `<text x="10" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", y+14, html.EscapeString(p.title))
		y += head
		rowY := map[string]int{}
		for j, wk := range rowsOf[i] {
			rowY[wk] = y + rowH*j
			label := wk
			if strings.HasPrefix(p.focus, wk+"-") {
				label += " (stale)"
			}
			fmt.Fprintf(w, `<text x="10" y="%d">%s</text><line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ddd"/>`+"\n", rowY[wk]+14, html.EscapeString(label), left, rowY[wk]+10, width-30, rowY[wk]+10)
		}
		clip := func(t int64) float64 { return x(min(max(t, p.from), p.to) - p.zero) }
		// Leases, clipped to the round.
		acquired, token, paused, invoked := map[string]int64{}, map[string]int64{}, map[string]int64{}, map[string]int64{}
		for _, e := range p.events {
			switch {
			case e.Kind == "acquire" && e.Phase == "ok":
				acquired[e.Op], token[e.Op] = e.Mono, e.Token
			case e.Kind == "release" && e.Phase == "invoke":
				a, ok := acquired[e.Op]
				yy, in := rowY[e.Worker]
				if !ok || !in || e.Mono < p.from || a > p.to {
					continue
				}
				x0, x1 := clip(a), clip(e.Mono)
				fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="12" fill="#9ecae1"><title>%s lease, token %d</title></rect>`+"\n",
					x0, yy+4, max(x1-x0, 1), html.EscapeString(e.Op), token[e.Op])
				if x1-x0 > 30 {
					fmt.Fprintf(w, `<text x="%.1f" y="%d" font-size="9">t%s</text>`+"\n", x0+2, yy+14, shortToken(token[e.Op]))
				}
			case e.Kind == "acquire" && e.Phase == "invoke":
				invoked[e.Op] = e.Mono
			case e.Kind == "acquire" && e.Phase == "fail":
				s, ok := invoked[e.Op]
				yy, in := rowY[e.Worker]
				if !ok || !in || e.Mono < p.from || s > p.to {
					continue
				}
				x0, x1 := clip(s), clip(e.Mono)
				what := "acquisition failed"
				if strings.Contains(e.Err, fence.ErrNotReplicated.Error()) {
					what = "lock refused (not replicated)"
				}
				fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="12" fill="none" stroke="#d62728" stroke-dasharray="3,2"><title>%s: %s</title></rect>`+"\n", x0, yy+4, max(x1-x0, 1), html.EscapeString(e.Op), html.EscapeString(e.Err))
				fmt.Fprintf(w, `<text x="%.1f" y="%d" font-size="10" fill="#d62728">%s, after %.0f ms</text>`+"\n", x0+4, yy+14, what, float64(e.Mono-s)/1e6)
			case e.Kind == "pause" && e.Phase == "invoke":
				paused[e.Op] = e.Mono
			case e.Kind == "pause" && e.Phase == "ok":
				s, ok := paused[e.Op]
				yy, in := rowY[e.Worker]
				if !ok || !in || e.Mono < p.from || s > p.to {
					continue
				}
				x0, x1 := clip(s), clip(e.Mono)
				fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="6" fill="#777"><title>%s stopped (SIGSTOP)</title></rect>`+"\n", x0, yy+16, max(x1-x0, 1), html.EscapeString(e.Op))
				fmt.Fprintf(w, `<text x="%.1f" y="%d" font-size="9" fill="#555">paused</text>`+"\n", x0+2, yy+29)
			}
		}
		// The resource's decisions.
		lastLabel := map[string]float64{}
		before := acceptedBefore(p.log)
		for i, l := range p.log {
			stale := l.Accepted && l.Token < before[i]
			yy, in := rowY[l.Worker]
			if !in || l.Mono < p.from || l.Mono > p.to {
				continue
			}
			color, what := "#2ca02c", "accepted"
			switch {
			case stale:
				color, what = "#ff7f0e", "accepted although stale"
			case !l.Accepted:
				color, what = "#d62728", "rejected"
			}
			lx := x(l.Mono - p.zero)
			fmt.Fprintf(w, `<circle cx="%.1f" cy="%d" r="5" fill="%s"><title>%s write, token %d: %s</title></circle>`+"\n", lx, yy+10, color, html.EscapeString(l.Op), l.Token, what)
			if l.Op == p.focus || !l.Accepted || stale {
				fmt.Fprintf(w, `<text x="%.1f" y="%d" font-size="10" fill="%s" text-anchor="end">t%s %s</text>`+"\n", lx-7, yy+2, color, shortToken(l.Token), what)
			} else if lx-lastLabel[l.Worker] > 45 {
				// Other writes get their token where there is room (all
				// have it in their tooltip).
				fmt.Fprintf(w, `<text x="%.1f" y="%d" font-size="8" fill="%s" text-anchor="middle">t%s</text>`+"\n", lx, yy+2, color, shortToken(l.Token))
				lastLabel[l.Worker] = lx
			}
		}
		y += rowH*len(rowsOf[i]) + 14
	}
	ly := height - 20
	fmt.Fprintf(w, `<text x="%d" y="%d">Time from the stale holder's acquisition. Blue: lease held (token). Grey: process stopped. Writes where the database decided: `+
		`<tspan fill="#2ca02c">● accepted</tspan> <tspan fill="#d62728">● rejected</tspan> <tspan fill="#ff7f0e">● accepted although stale</tspan></text>`+"\n", 10, ly)
	fmt.Fprintln(w, "</svg>")
	return true
}

// niceStep rounds a step in ms to 1, 2 or 5 times a power of ten.
func niceStep(ms float64) float64 {
	if ms <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(ms)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= ms {
			return m * p
		}
	}
	return 10 * p
}
