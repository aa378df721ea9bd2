package lab

import (
	"fmt"
	"html"
	"io"
	"sort"
)

// timeline is what a picture of a run needs.
type timeline struct {
	events []Event
	log    []Entry
}

// svg draws one row per worker: its leases as bars (grey while it was
// stopped), and each write it sent as a mark where the resource decided:
// green accepted, red rejected, orange accepted although stale (P1).
func (tl *timeline) svg(w io.Writer, title string) {
	if len(tl.events) == 0 {
		return
	}
	t0, t1 := tl.events[0].Mono, tl.events[0].Mono
	rows := map[string]int{}
	var workers []string
	for _, e := range tl.events {
		t0, t1 = min(t0, e.Mono), max(t1, e.Mono)
		if _, ok := rows[e.Worker]; !ok {
			rows[e.Worker] = 0
			workers = append(workers, e.Worker)
		}
	}
	sort.Strings(workers)
	for i, wk := range workers {
		rows[wk] = i
	}
	const left, top, rowH, width = 90, 40, 34, 1100
	span := float64(max(t1-t0, 1))
	x := func(t int64) float64 { return left + float64(t-t0)/span*float64(width-left-20) }
	height := top + rowH*len(workers) + 50
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/><text x="10" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	for _, wk := range workers {
		y := top + rowH*rows[wk]
		fmt.Fprintf(w, `<text x="10" y="%d">%s</text><line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ddd"/>`+"\n", y+18, html.EscapeString(wk), left, y+13, width-20, y+13)
	}
	// Leases, then the pauses over them.
	acquired, paused := map[string]int64{}, map[string]int64{}
	for _, e := range tl.events {
		y := top + rowH*rows[e.Worker]
		switch {
		case e.Kind == "acquire" && e.Phase == "ok":
			acquired[e.Op] = e.Mono
		case e.Kind == "release" && e.Phase == "invoke":
			if a, ok := acquired[e.Op]; ok {
				fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="12" fill="#9ecae1"><title>%s token %d</title></rect>`+"\n",
					x(a), y+7, max(x(e.Mono)-x(a), 1), html.EscapeString(e.Op), e.Token)
			}
		}
	}
	for _, e := range tl.events {
		y := top + rowH*rows[e.Worker]
		switch {
		case e.Kind == "pause" && e.Phase == "invoke":
			paused[e.Op] = e.Mono
		case e.Kind == "pause" && e.Phase == "ok":
			if p, ok := paused[e.Op]; ok {
				fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="12" fill="#999"><title>%s stopped (SIGSTOP)</title></rect>`+"\n",
					x(p), y+7, max(x(e.Mono)-x(p), 1), html.EscapeString(e.Op))
			}
		}
	}
	// The resource's decisions on writes.
	before := acceptedBefore(tl.log)
	for i, e := range tl.log {
		stale := e.Accepted && e.Token < before[i]
		if e.Kind != "write" {
			continue
		}
		row, ok := rows[e.Worker]
		if !ok {
			continue
		}
		y := top + rowH*row + 13
		color, what := "#2ca02c", "accepted"
		switch {
		case stale:
			color, what = "#ff7f0e", "accepted although stale"
		case !e.Accepted:
			color, what = "#d62728", "rejected"
		}
		fmt.Fprintf(w, `<circle cx="%.1f" cy="%d" r="5" fill="%s"><title>%s token %d %s</title></circle>`+"\n", x(e.Mono), y, color, html.EscapeString(e.Op), e.Token, what)
	}
	ly := top + rowH*len(workers) + 25
	fmt.Fprintf(w, `<text x="%d" y="%d">%.0f ms. Blue: lease held. Grey: process stopped. Writes: `+
		`<tspan fill="#2ca02c">● accepted</tspan> <tspan fill="#d62728">● rejected</tspan> <tspan fill="#ff7f0e">● accepted although stale</tspan></text>`+"\n",
		left, ly, span/1e6)
	fmt.Fprintln(w, "</svg>")
}
