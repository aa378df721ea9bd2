// Command bench measures fence against peer Redis lock libraries on one
// redis-server in one run, and writes the ratios to BENCHMARKS.md.
//
//	make bench        (from the repository root)
//	cd bench && go run . -out ../BENCHMARKS.md
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/fencekit/fence/internal/etcdserver"
	"github.com/fencekit/fence/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

func main() {
	out := flag.String("out", "BENCHMARKS.md", "where to write the report")
	dur := flag.Duration("duration", 3*time.Second, "length of each throughput workload")
	n := flag.Int("n", 3000, "acquire+release pairs for the latency and allocation figures")
	only := flag.String("distinct", "", "only the distinct-keys workload (and uncontended p50), in rounds, for the libraries whose names are listed (separated by ;); print, write nothing")
	parts := flag.Int("scriptparts", 0, "only measure what each part of redislock's scripts costs the server, in this many rounds (see scripttime.md); print, write nothing")
	flag.Parse()
	if *parts > 0 {
		if err := scriptParts(*parts, *n); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *only != "" {
		if err := distinctOnly(strings.Split(*only, ";"), *dur); err != nil {
			log.Fatal(err)
		}
		return
	}
	if err := run(*out, *dur, *n); err != nil {
		log.Fatal(err)
	}
}

type row struct {
	name                 string
	p50, p99             time.Duration
	changes, handoffsP99 float64 // holder changes per second; p99 handoff in ms
	releaseP99           float64 // p99 of a release call in the contended workload, ms
	acqPerSec            float64
	distinct             float64
	cmdsPerAcq           float64
	cmdsSlack            float64 // cmdsPerAcq's error bound (contendedResult.cmdsSlack)
	allocs               float64
	scriptUS             float64 // the server's time in one uncontended pair's scripts, µs (uncontended)
	contendedErr         string
}

func run(out string, dur time.Duration, n int) error {
	loadBefore := loadAverage()
	primary, replicas, err := redisserver.StartReplicated(1)
	if err != nil {
		return err
	}
	defer primary.Close()
	replica := replicas[0]
	defer replica.Close()
	log.Printf("redis-server primary %s with replica %s", primary.Addr, replica.Addr)

	all, err := libs(primary.Addr)
	if err != nil {
		return err
	}
	// The floors of the round trips fence makes, sync off and on: they
	// fail rather than wait, so they sit out the contended workload.
	floors := []*lib{limit(primary.Addr), limitSynced(primary.Addr), limitToken(primary.Addr)}
	everyone := append(all, floors...)
	defer func() {
		for _, l := range everyone {
			l.close()
		}
	}()

	clock, closeClock := newScriptClock(primary.Addr)
	defer closeClock()
	rows, err := rotate(everyone, n, clock, func(l *lib, r *row) error {
		var err error
		if r.distinct, err = distinct(l, 64, dur); err != nil {
			return fmt.Errorf("%s distinct: %w", l.name, err)
		}
		if r.allocs, err = allocs(l, n); err != nil {
			return fmt.Errorf("%s allocs: %w", l.name, err)
		}
		if !slices.Contains(floors, l) {
			contendedRow(r, l, dur)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := countCommands(primary.Addr, rows, dur); err != nil {
		return err
	}
	rb := redisBenchmark(primary)

	rl, err := redlockRows(dur, n)
	if err != nil {
		return err
	}
	et, err := etcdRows(dur, n)
	if err != nil {
		return err
	}
	load := fmt.Sprintf("%s at the start, %s at the end", loadBefore, loadAverage())
	return os.WriteFile(out, []byte(report(rows, rl, et, rb, load, dur, n)), 0o644)
}

// rotate measures every library in rounds and returns each library's
// median round: a noisy moment then hurts one round of one library, not the
// comparison. Each round first times n uncontended pairs of every library,
// interleaved in batches (the other jobs on the machine come in bursts, and
// a burst then falls on every library alike), then runs measure on every
// library in a rotating order.
func rotate(ls []*lib, n int, scripts scriptClock, measure func(*lib, *row) error) ([]*row, error) {
	samples := make([][]row, len(ls))
	for round := range rounds {
		rs := make([]row, len(ls))
		lat, err := uncontended(ls, n, round, scripts)
		if err != nil {
			return nil, err
		}
		for i, l := range ls {
			rs[i] = row{name: l.name, p50: lat[i].p50, p99: lat[i].p99, scriptUS: lat[i].scriptUS}
		}
		for k := range ls {
			i := (k + round) % len(ls)
			if err := measure(ls[i], &rs[i]); err != nil {
				return nil, err
			}
			r := rs[i]
			log.Printf("round %d %-42s p50 %v p99 %v distinct %.0f/s allocs %.1f contended %.0f changes/s p99 %.2fms %s",
				round+1, r.name, r.p50, r.p99, r.distinct, r.allocs, r.changes, r.handoffsP99, r.contendedErr)
			samples[i] = append(samples[i], r)
		}
	}
	rows := make([]*row, len(ls))
	for i, l := range ls {
		rows[i] = &row{name: l.name}
		median(rows[i], samples[i])
	}
	return rows, nil
}

// contendedRow runs the contended workload (32 goroutines, one key) on l
// and records it in r.
func contendedRow(r *row, l *lib, dur time.Duration) {
	c, err := contended(l, 32, dur)
	if err != nil {
		r.contendedErr = err.Error()
	}
	r.changes = float64(c.holderChanges) / c.seconds
	r.acqPerSec = float64(c.acquisitions) / c.seconds
	r.handoffsP99 = float64(c.p99Handoff.Microseconds()) / 1000
	r.releaseP99 = float64(c.p99Release.Microseconds()) / 1000
}

// quorumWorkloads are the workloads of the Redlock and etcd rows besides
// the uncontended latency: allocations and the contended workload.
func quorumWorkloads(n int, dur time.Duration) func(*lib, *row) error {
	return func(l *lib, r *row) error {
		var err error
		if r.allocs, err = allocs(l, n); err != nil {
			return fmt.Errorf("%s allocs: %w", l.name, err)
		}
		contendedRow(r, l, dur)
		return nil
	}
}

// redlockRows measures fence's redlock beside redsync's Redlock on 3 and on
// 5 independent redis-servers (the 3 are the first of the 5).
func redlockRows(dur time.Duration, n int) ([]*row, error) {
	var addrs []string
	for range 5 {
		s, err := redisserver.Start("")
		if err != nil {
			return nil, err
		}
		defer s.Close()
		addrs = append(addrs, s.Addr)
	}
	log.Printf("independent redis-servers %v", addrs)
	var ls []*lib
	defer func() {
		for _, l := range ls {
			l.close()
		}
	}()
	for _, k := range []int{3, 5} {
		more, err := redlockLibs(addrs[:k])
		if err != nil {
			return nil, err
		}
		ls = append(ls, more...)
	}
	return rotate(ls, n, nil, quorumWorkloads(n, dur))
}

// etcdRows measures fence's etcdlock beside concurrency.Mutex on one etcd
// server, built from internal/etcdserver/etcdmain (cached after the first
// build).
func etcdRows(dur time.Duration, n int) ([]*row, error) {
	srv, err := etcdserver.Start("")
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	log.Printf("etcd %v", srv.Endpoints())
	ls, err := etcdLibs(srv.Endpoints())
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, l := range ls {
			l.close()
		}
	}()
	return rotate(ls, etcdPairs(n), nil, quorumWorkloads(etcdPairs(n), dur))
}

// etcdPairs is how many pairs the etcd rows time: every write there is a
// Raft commit, a few milliseconds each on a loaded machine, so a third.
func etcdPairs(n int) int { return max(n/3, 100) }

// countCommands runs the contended workload again, each library through a
// proxy that counts the commands it sends, and divides by acquisitions. The
// count is taken over a window in the middle of a running workload (see
// contendedWindow): after a warm-up that every library gets alike (the same
// workload for a tenth of dur, at least 200 ms), with its connections open,
// their handshakes (HELLO, CLIENT SETINFO) sent and its subscriptions made,
// as in a process that has been locking for a while.
func countCommands(addr string, rows []*row, dur time.Duration) error {
	p, err := newCountingProxy(addr)
	if err != nil {
		return err
	}
	defer p.close()
	ls, err := libs(p.addr())
	if err != nil {
		return err
	}
	for i, l := range ls {
		c, perAcq, err := contendedWindow(l, 32, warmUp(dur), dur, p.commands.Load)
		l.close()
		if err != nil && c.acquisitions == 0 {
			return fmt.Errorf("%s counted: %w", l.name, err)
		}
		rows[i].cmdsPerAcq, rows[i].cmdsSlack = perAcq, c.cmdsSlack
	}
	return nil
}

// warmUp is how long countCommands runs the contended workload before it
// starts counting.
func warmUp(dur time.Duration) time.Duration { return max(dur/10, 200*time.Millisecond) }

// redisBenchmark runs redis-benchmark with fence's acquire script over 64
// connections and random keys, for the server's own figure.
func redisBenchmark(primary *redisserver.Server) string {
	c := redis.NewClient(&redis.Options{Addr: primary.Addr})
	defer c.Close()
	// The acquire script is token.lua followed by acquire.lua with
	// grant.lua at its marker line (see redislock/scripts.go).
	read := func(f string) (string, error) {
		b, err := os.ReadFile("../redislock/" + f)
		return string(b), err
	}
	var parts [3]string
	for i, f := range []string{"token.lua", "acquire.lua", "grant.lua"} {
		var err error
		if parts[i], err = read(f); err != nil {
			return "not run: " + err.Error()
		}
	}
	src := parts[0] + strings.Replace(parts[1], "-- grant.lua --\n", parts[2], 1)
	sha, err := c.ScriptLoad(context.Background(), src).Result()
	if err != nil {
		return "not run: " + err.Error()
	}
	cmd := exec.Command("redis-benchmark", "-h", primary.Host(), "-p", primary.Port(), "-c", "64", "-n", "200000", "-r", "100000", "-q",
		"EVALSHA", sha, "5", "bench:rb:{__rand_int__}", "bench:rb:{__rand_int__}:token", "bench:rb:{__rand_int__}:revoked:owner",
		"bench:rb:{__rand_int__}:queue", "bench:rb:{__rand_int__}:waiters", "owner", "10000", "86400000", "0", "0", "PUBLISH")
	outb, err := cmd.CombinedOutput()
	if err != nil {
		return "not run: " + err.Error() + ": " + strings.TrimSpace(string(outb))
	}
	m := regexp.MustCompile(`([0-9.]+) requests per second`).FindStringSubmatch(string(outb))
	if m == nil {
		return "not run: " + strings.TrimSpace(string(outb))
	}
	return m[1]
}

// rounds is how many times each workload runs per library.
const rounds = 3

// median sets each figure of r to the median of the samples.
func median(r *row, samples []row) {
	pick := func(get func(row) float64) float64 {
		vs := make([]float64, len(samples))
		for i, s := range samples {
			vs[i] = get(s)
		}
		slices.Sort(vs)
		return vs[len(vs)/2]
	}
	r.p50 = time.Duration(pick(func(s row) float64 { return float64(s.p50) }))
	r.p99 = time.Duration(pick(func(s row) float64 { return float64(s.p99) }))
	r.distinct = pick(func(s row) float64 { return s.distinct })
	r.allocs = pick(func(s row) float64 { return s.allocs })
	r.changes = pick(func(s row) float64 { return s.changes })
	r.acqPerSec = pick(func(s row) float64 { return s.acqPerSec })
	r.handoffsP99 = pick(func(s row) float64 { return s.handoffsP99 })
	r.releaseP99 = pick(func(s row) float64 { return s.releaseP99 })
	r.scriptUS = pick(func(s row) float64 { return s.scriptUS })
	for _, s := range samples {
		if s.contendedErr != "" {
			r.contendedErr = s.contendedErr
		}
	}
}

// loadAverage is the machine's 1-minute load average, from /proc/loadavg.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b) + " ?")[0]
}

func version(cmd ...string) string {
	out, err := exec.Command(cmd[0], cmd[1:]...).Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}

// distinctOnly runs the distinct-keys workload (64 goroutines), after 1000
// uncontended pairs each, on the named libraries, in rounds in rotating
// order, on a fresh primary with one replica, and prints each round and the
// medians.
func distinctOnly(names []string, dur time.Duration) error {
	primary, replicas, err := redisserver.StartReplicated(1)
	if err != nil {
		return err
	}
	defer primary.Close()
	defer replicas[0].Close()
	all, err := libs(primary.Addr)
	if err != nil {
		return err
	}
	all = append(all, limit(primary.Addr), limitToken(primary.Addr))
	var ls []*lib
	for _, l := range all {
		defer l.close()
		if slices.Contains(names, l.name) {
			ls = append(ls, l)
		}
	}
	if len(ls) != len(names) {
		return fmt.Errorf("unknown library among %q", names)
	}
	samples := make([][]float64, len(ls))
	p50s := make([][]float64, len(ls))
	for round := range rounds {
		lat, err := uncontended(ls, 1000, round, nil)
		if err != nil {
			return err
		}
		for i := range ls {
			p50s[i] = append(p50s[i], float64(lat[i].p50.Microseconds()))
		}
		for k := range ls {
			i := (k + round) % len(ls)
			ops, err := distinct(ls[i], 64, dur)
			if err != nil {
				return err
			}
			log.Printf("round %d %-30s %.0f pairs/s", round+1, ls[i].name, ops)
			samples[i] = append(samples[i], ops)
		}
	}
	for i, l := range ls {
		slices.Sort(samples[i])
		slices.Sort(p50s[i])
		fmt.Printf("%-30s distinct: median %.0f pairs/s (rounds %.0f); uncontended p50: median %.0f µs (rounds %.0f)\n",
			l.name, samples[i][len(samples[i])/2], samples[i], p50s[i][len(p50s[i])/2], p50s[i])
	}
	return nil
}
