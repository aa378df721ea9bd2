package main

import (
	"fmt"
	"github.com/redis/go-redis/v9"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkContended is make bench's contended workload (32 goroutines, one
// key) for the libraries named in BENCH_LIBS (separated by ;, default
// fence's two go-redis rows and rueidislock), in rounds of rotating order,
// with the same warm-up as countCommands: holder changes/s, p99 handoff
// and (with BENCH_COUNT set, each library through the counting proxy, as
// countCommands) commands per acquisition, with the medians over the
// rounds (b.N rounds). BENCH_HIST prints the handoffs' percentiles,
// BENCH_NAMES the commands counted by name.
//
//	go test -run '^$' -bench Contended -benchtime 5x -v
//	BENCH_COUNT=1 BENCH_LIBS='fence (sync off)' BENCH_DUR=2s go test -run '^$' -bench Contended -benchtime 3x -v
func BenchmarkContended(b *testing.B) {
	want := []string{"fence (sync off)", "fence (sync on, 1 replica)", "rueidislock"}
	if s := os.Getenv("BENCH_LIBS"); s != "" {
		want = strings.Split(s, ";")
	}
	dur := 2 * time.Second
	if s := os.Getenv("BENCH_DUR"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatal(err)
		}
		dur = d
	}
	p, err := newCountingProxy(addr)
	if err != nil {
		b.Fatal(err)
	}
	defer p.close()
	// Through the proxy only when counting: it adds a hop to every
	// command, and to the handoffs.
	target, count := addr, func() int64 { return 0 }
	if os.Getenv("BENCH_COUNT") != "" {
		target, count = p.addr(), p.commands.Load
	}
	all, err := libs(target)
	if err != nil {
		b.Fatal(err)
	}
	// The servers' CPU (the primary's and its replica's user and system
	// time) per acquisition, warm-up included.
	primaryC := redis.NewClient(&redis.Options{Addr: addr})
	defer primaryC.Close()
	replicaC := redis.NewClient(&redis.Options{Addr: replicaAddr})
	defer replicaC.Close()
	var ls []*lib
	for _, l := range all {
		defer l.close()
		if slices.Contains(want, l.name) {
			ls = append(ls, l)
		}
	}
	type sample struct{ changes, p99, cmds float64 }
	samples := make([][]sample, len(ls))
	round := 0
	for b.Loop() {
		for k := range ls {
			i := (k + round) % len(ls)
			l := ls[i]
			p.tally()
			s0, r0 := serverCPU(b, primaryC), serverCPU(b, replicaC)
			c, perAcq, err := contendedWindow(l, 32, warmUp(dur), dur, count)
			cpuPerAcq := (serverCPU(b, primaryC) - s0 + serverCPU(b, replicaC) - r0) / float64(max(c.acquisitions, 1))
			if err != nil {
				b.Fatalf("%s: %v", l.name, err)
			}
			s := sample{float64(c.holderChanges) / c.seconds, float64(c.p99Handoff.Microseconds()) / 1000,
				perAcq}
			samples[i] = append(samples[i], s)
			if os.Getenv("BENCH_HIST") != "" {
				b.Logf("%s handoffs: %s", l.name, c.spread())
			}
			if os.Getenv("BENCH_NAMES") != "" {
				b.Logf("%s whole run (warm-up too): acquisitions %d commands %v", l.name, c.acquisitions, p.byName())
			}
			b.Logf("round %d %-30s %6.0f changes/s, p99 handoff %.2f ms, %.3f commands/acq, servers' CPU %.1f µs/acq", round+1, l.name, s.changes, s.p99, s.cmds, cpuPerAcq)
		}
		round++
	}
	med := func(xs []float64) float64 { slices.Sort(xs); return xs[len(xs)/2] }
	var meds []float64
	for i, l := range ls {
		var ch, p99, cmds []float64
		for _, s := range samples[i] {
			ch, p99, cmds = append(ch, s.changes), append(p99, s.p99), append(cmds, s.cmds)
		}
		meds = append(meds, med(ch))
		b.Logf("median %-30s %6.0f changes/s, p99 handoff %.2f ms, %.3f commands/acq", l.name, med(ch), med(p99), med(cmds))
	}
	if len(ls) > 1 {
		b.Logf("changes ratio %s ÷ %s: %.3f", ls[0].name, ls[len(ls)-1].name, meds[0]/meds[len(meds)-1])
	}
}

// spread is the handoffs' percentiles, for BENCH_HIST.
func (r contendedResult) spread() string {
	hs := slices.Clone(r.handoffs)
	slices.Sort(hs)
	if len(hs) == 0 {
		return "none"
	}
	var out []string
	for _, q := range []float64{0.5, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999} {
		out = append(out, fmt.Sprintf("p%g %v", q*100, hs[int(q*float64(len(hs)-1))].Round(time.Microsecond)))
	}
	return strings.Join(out, ", ")
}
