package main

import (
	"fmt"
	"runtime"
	"strings"
	"time"
)

func us(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d.Nanoseconds())/1000) }

func ratio(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

// report renders BENCHMARKS.md. rows: fence sync off, fence sync on, then
// the peers, then the limit.
func report(rows []*row, redisBench string, dur time.Duration, n int) string {
	byName := map[string]*row{}
	for _, r := range rows {
		byName[r.name] = r
	}
	off, on := rows[0], rows[1]
	bsm, redsync, rueidis, lim := byName["bsm/redislock"], byName["redsync"], byName["rueidislock"], rows[len(rows)-1]

	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Benchmarks\n\n")
	w("fence against peer Redis lock libraries, measured in one run on one `redis-server` (a primary with one replica, so that\n")
	w("fence's replica sync has something to wait for; every library talks to the same primary). Ratios compare figures from\n")
	w("this run only. The machine is shared and noisy: rerun before trusting a difference under about 20%%.\n\n")
	w("- Date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	w("- Machine: %s/%s, %d CPUs (%s); client and server share them\n", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), version("uname", "-sr"))
	w("- Versions: %s; %s; bsm/redislock v0.9.4, go-redsync/redsync v4.18.1, redis/rueidis (rueidislock) v1.0.79, go-redis v9.23.0\n", runtime.Version(), version("redis-server", "--version"))
	w("- Reproduce: `make bench` (runs `cd bench && go run . -out ../BENCHMARKS.md`: %v per throughput workload, %d pairs for latency and\n", dur, n)
	w("  allocations; every workload runs %d rounds with the libraries in rotating order, and each figure is the median round)\n\n", rounds)

	w("Every library is used as its documentation suggests, with its defaults, except: a 10 s lease everywhere; bsm/redislock\n")
	w("waits only with a retry strategy, so it gets `LinearBackoff(1ms)`; redsync gives up after its default 32 tries, so the\n")
	w("workload calls it again until it succeeds. fence always issues a fencing token (it has no unfenced mode); \"sync on\" adds\n")
	w("the `WAIT` for one replica, pipelined with the acquire script.\n\n")

	w("## Uncontended acquire + release, one goroutine\n\n| library | p50 µs | p99 µs | p50 vs bsm/redislock |\n|---|---:|---:|---:|\n")
	for _, r := range rows {
		w("| %s | %s | %s | %s |\n", r.name, us(r.p50), us(r.p99), ratio(float64(r.p50), float64(bsm.p50)))
	}
	w("\n## 32 goroutines contending for one key\n\nA holder change is an acquisition by another goroutine than the previous holder (with zero hold time a releaser\n")
	w("often takes the lock straight back); handoff latency runs from the moment the previous holder began to release.\n\n")
	w("| library | holder changes/s | acquisitions/s | p99 handoff ms | commands sent per acquisition | fence (sync on) ÷ this |\n|---|---:|---:|---:|---:|---:|\n")
	for _, r := range rows[:len(rows)-1] {
		note := ""
		if r.contendedErr != "" {
			note = " (error: " + r.contendedErr + ")"
		}
		w("| %s%s | %.0f | %.0f | %.1f | %.2f | %s |\n", r.name, note, r.changes, r.acqPerSec, r.handoffsP99, r.cmdsPerAcq, ratio(on.changes, r.changes))
	}
	w("\nCommands are counted by a proxy in front of the server, as the client sends them (round trips), not by `INFO\n")
	w("commandstats`, which also counts what scripts run inside the server. Subscriptions count.\n\n")
	w("## 64 goroutines over distinct keys\n\n| library | acquire+release pairs/s | vs the limit |\n|---|---:|---:|\n")
	for _, r := range rows {
		w("| %s | %.0f | %s |\n", r.name, r.distinct, ratio(r.distinct, lim.distinct))
	}
	w("\nThe limit is two bare `EVALSHA` round trips per pair through go-redis (a `SET NX PX` script and an owner-checked `DEL`\n")
	w("script): no token, no waiting. `redis-benchmark` running fence's acquire script over 64 connections: %s requests/s\n", redisBench)
	w("(one round trip each, so about half that in pairs, with no client library in the way).\n\n")
	w("## Allocations per acquire + release\n\n| library | allocations |\n|---|---:|\n")
	for _, r := range rows {
		w("| %s | %.1f |\n", r.name, r.allocs)
	}
	w("\nCounted with `runtime.MemStats.Mallocs` over %d pairs in a row; background goroutines of a library count too.\n\n", n)

	w("## Targets\n\n| target | fence (sync off) | fence (sync on) |\n|---|---|---|\n")
	w("| uncontended p50 ≤ 1.0× bsm/redislock | %s %s | %s %s |\n",
		ratio(float64(off.p50), float64(bsm.p50)), met(off.p50 <= bsm.p50), ratio(float64(on.p50), float64(bsm.p50)), met(on.p50 <= bsm.p50))
	w("| contended holder changes/s ≥ 10× redsync | %s %s | %s %s |\n",
		ratio(off.changes, redsync.changes), met(off.changes >= 10*redsync.changes), ratio(on.changes, redsync.changes), met(on.changes >= 10*redsync.changes))
	w("| contended holder changes/s ≥ 1.5× rueidislock | %s %s | %s %s |\n",
		ratio(off.changes, rueidis.changes), met(off.changes >= 1.5*rueidis.changes), ratio(on.changes, rueidis.changes), met(on.changes >= 1.5*rueidis.changes))
	w("| ≤ 4 commands per contended acquisition | %.2f %s | %.2f %s |\n", off.cmdsPerAcq, met(off.cmdsPerAcq <= 4), on.cmdsPerAcq, met(on.cmdsPerAcq <= 4))
	w("| distinct-key throughput ≥ 0.8× the limit | %s %s | %s %s |\n",
		ratio(off.distinct, lim.distinct), met(off.distinct >= 0.8*lim.distinct), ratio(on.distinct, lim.distinct), met(on.distinct >= 0.8*lim.distinct))
	w("| ≤ 30 allocations per acquire+release | %.1f %s | %.1f %s |\n", off.allocs, met(off.allocs <= 30), on.allocs, met(on.allocs <= 30))
	w(`
## Where fence misses a target, and what would close it

- **Uncontended latency against bsm/redislock's unfenced lock.** fence's acquire script also issues the token (TIME,
  GET and SET of the token record) and its release publishes to the release channel: five more calls inside the
  server per pair than bsm's, and the lease's context and expiry timer on the client. Storing the token in the lock's
  own value, and publishing only when a waiter has registered, would take most of that back. With sync on, WAIT waits
  for the replica's acknowledgement, a second hop that no unsynced lock pays: that part is the guarantee's price and
  will not close.
- **Contended holder changes against rueidislock (1.5×).** A handoff is release → publish → one local waiter wakes →
  acquire: about two round trips, and with zero hold time the releasing goroutine often takes the lock straight back.
  Grant-on-release (waiters queue in Redis; the release script hands the lock and its new token to the head waiter)
  would make it one; not built yet.
- **Commands per contended acquisition with sync on.** Every attempt pipelines WAIT with the script, including the
  attempts that find the lock held, since the pipeline is sent before the reply is known: about two commands per
  failed attempt. Grant-on-release would remove most failed attempts; sending WAIT only after a successful script, on
  the same connection, would remove the rest at the cost of a second round trip on success.
- **Distinct-key throughput against two bare EVALSHA calls.** The same extra calls inside the server, on a machine
  where client and server share two CPUs. The lighter scripts above, and an adapter for rueidis's automatic
  pipelining (1.6× a go-redis pool over 64 keys in an earlier measurement), are the levers.
- **Allocations.** Per lease: a cancellable context and its parent, the expiry timer, the owner id, three key strings,
  the option closures. Creating the lease's context lazily, building the keys once per name and an option struct
  without closures would bring it near go-redis's own 22 for two script calls.
`)
	return b.String()
}
