package main

import (
	_ "embed"
	"fmt"
	"runtime"
	"strings"
	"time"
)

// whereTheTimeGoes is the profile of fence's uncontended acquire+release,
// written by hand from the profiles that `go test -bench` in this module
// records (profile_test.go); make bench copies it in as it is.
//
//go:embed timegoes.md
var whereTheTimeGoes string

func us(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d.Nanoseconds())/1000) }

// signedUS is d in µs with its sign.
func signedUS(d time.Duration) string { return fmt.Sprintf("%+.0f", float64(d.Nanoseconds())/1000) }

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
// the peers, then the floors (limitRow, limitSyncedRow, limitTokenRow); rl: fence's redlock and redsync in pairs, on 3
// masters then on 5; et: etcdlock, then concurrency.Mutex with a session
// per goroutine, then with a session per lock.
func report(rows, rl, et []*row, redisBench, load string, dur time.Duration, n int) string {
	byName := map[string]*row{}
	for _, r := range rows {
		byName[r.name] = r
	}
	off, on, obs := rows[0], rows[1], byName[observerRow]
	bsm, redsync, rueidis, lim := byName["bsm/redislock"], byName["redsync"], byName["rueidislock"], byName[limitRow]
	limS, limT := byName[limitSyncedRow], byName[limitTokenRow]
	if bsm == nil || redsync == nil || rueidis == nil || byName[rueidisRow] == nil || lim == nil || limS == nil || limT == nil || len(et) < 2 {
		panic("bench: report is missing a peer's row")
	}

	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Benchmarks\n\n")
	w("fence against peer lock libraries, measured in one run: the Redis rows on one `redis-server` (a primary with one\n")
	w("replica, so that fence's replica sync has something to wait for; every library talks to the same primary), the Redlock\n")
	w("rows on five independent `redis-server` processes, the etcd rows on one etcd server. Ratios compare figures from this\n")
	w("run only. The machine is shared and noisy: rerun before trusting a difference under about 20%%.\n\n")
	w("- Date: %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	w("- Machine: %s/%s, %d CPUs (%s); client and server share them\n", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), version("uname", "-sr"))
	w("- Load: 1-minute load average %s (other jobs share the machine: on %d CPUs, anything above %d means waiting for a CPU)\n", load, runtime.NumCPU(), runtime.NumCPU())
	w("- Versions: %s; %s; bsm/redislock v0.9.4, go-redsync/redsync v4.18.1, redis/rueidis (rueidislock) v1.0.79, go-redis v9.23.0\n", runtime.Version(), version("redis-server", "--version"))
	w("- Reproduce: `make bench` (runs `cd bench && go run . -out ../BENCHMARKS.md`: %v per throughput workload, %d pairs for latency and\n", dur, n)
	w("  allocations; every workload runs %d rounds with the libraries in rotating order, and each figure is the median round;\n", rounds)
	w("  the uncontended pairs of a group's libraries are timed in turns of %d, so that a burst of load falls on all of them)\n\n", batch)

	w("Every library is used as its documentation suggests, with its defaults, except: a 10 s lease everywhere; bsm/redislock\n")
	w("waits only with a retry strategy, so it gets `LinearBackoff(1ms)`; redsync gives up after its default 32 tries, so the\n")
	w("workload calls it again until it succeeds. fence always issues a fencing token (it has no unfenced mode); \"sync on\" adds\n")
	w("the `WAIT` for one replica, pipelined with the acquire script. \"%s\" is the same lock (`redislock`) over a\n", rueidisRow)
	w("rueidis client through `fencerueidis`, with rueidis's defaults (automatic pipelining), as rueidislock is.\n\n")

	w("## Uncontended acquire + release, one goroutine\n\n| library | p50 µs | p99 µs | p50 vs bsm/redislock | µs in scripts |\n|---|---:|---:|---:|---:|\n")
	for _, r := range rows {
		scripts := "–"
		if scriptsOnly(r.name) {
			scripts = fmt.Sprintf("%.1f", r.scriptUS)
		}
		w("| %s | %s | %s | %s | %s |\n", r.name, us(r.p50), us(r.p99), ratio(float64(r.p50), float64(bsm.p50)), scripts)
	}
	w("\nThe first two limit rows are the floors of the round trips fence makes, through go-redis and doing nothing else:\n")
	w("sync off, two bare `EVALSHA` calls (a `SET NX PX` script, an owner-checked `DEL` script); sync on, the first pipelined\n")
	w("with `WAIT 1` on one connection, as fence pipelines its acquire script. fence (sync off) is %s its floor and fence\n",
		ratio(float64(off.p50), float64(lim.p50)))
	w("(sync on) %s its floor; the floors themselves are %s and %s bsm/redislock's p50, whose acquire is a plain `SET NX PX`.\n",
		ratio(float64(on.p50), float64(limS.p50)), ratio(float64(lim.p50), float64(bsm.p50)), ratio(float64(limS.p50), float64(bsm.p50)))
	w("The third, \"%s\", is the first with a token: its lock script also `INCR`s a counter when it takes the\n", limT.name)
	w("lock, the least a fenced lock writes (a counter that eviction or a failover can set back, which fence's token record\n")
	w("and clock floor do not allow). It is %s bsm/redislock's p50, and fence (sync off) %s it.\n",
		ratio(float64(limT.p50), float64(bsm.p50)), ratio(float64(off.p50), float64(limT.p50)))
	w("\n\"µs in scripts\" is the time the server spent running one pair's scripts, with the commands they call, on the\n")
	w("pairs timed above: `EVALSHA` and `EVAL` in `INFO commandstats`, read before and after each turn of %d pairs, the\n", batch)
	w("median turn's figure per pair (a turn in which the server lost its CPU counts its wait), then the median round's. Every\n")
	w("command of those libraries' pairs is a script, so it is all their time in commands (not the reading and writing of\n")
	w("sockets, nor a `WAIT`'s wait); redsync and rueidislock also send plain commands, which it would leave out. Client\n")
	w("and server share the CPUs, so that time is in every pair's latency. fence (sync off)'s p50 is %s µs from bsm/redislock's,\n", signedUS(off.p50-bsm.p50))
	w("and its scripts take the server %.1f µs more (%.1f against %.1f). The counter-token floor's take %.1f, the plain\n",
		off.scriptUS-bsm.scriptUS, off.scriptUS, bsm.scriptUS, limT.scriptUS)
	w("floor's %.1f; what fence's take over the counter-token floor's is the rest of its token (the clock, the record read\n", lim.scriptUS)
	w("and checked before it is written), the checks for a queue of waiters and a revoked owner, and more keys and arguments.\n")
	w("\n## 32 goroutines contending for one key\n\nA holder change is an acquisition by another goroutine than the previous holder (with zero hold time a releaser\n")
	w("often takes the lock straight back); handoff latency runs from the moment the previous holder began to release.\n\n")
	w("| library | holder changes/s | acquisitions/s | p99 handoff ms | p99 release call ms | commands sent per acquisition | fence (sync on) ÷ this |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		if r == lim || r == limS || r == limT {
			continue // they fail rather than wait
		}
		note := ""
		if r.contendedErr != "" {
			note = " (error: " + r.contendedErr + ")"
		}
		w("| %s%s | %.0f | %.0f | %.2f | %.2f | %.2f | %s |\n", r.name, note, r.changes, r.acqPerSec, r.handoffsP99, r.releaseP99, r.cmdsPerAcq, ratio(on.changes, r.changes))
	}
	w("\nA release call is timed from the moment its handoff is timed from, to its return: one round trip for every\n")
	w("library here. fence's release script is what hands the lock to the next waiter: the grant's publish and the call's\n")
	w("reply leave the server together, so fence's handoff ends about when that round trip does. Its p99 handoff is %s\n", ratio(off.handoffsP99, off.releaseP99))
	w("its p99 release call.\n")
	w("\nCommands are counted by a proxy in front of the server, as the client sends them (round trips), not by `INFO\n")
	w("commandstats`, which also counts what scripts run inside the server. Subscriptions count. They are counted over a\n")
	w("window in the middle of a running workload, after a warm-up that every library gets alike (the same workload,\n")
	w("uncounted, for a tenth of the time): connections open, handshakes sent and subscriptions made, as in a process\n")
	w("that has been locking for a while.\n\n")
	w("## 64 goroutines over distinct keys\n\n| library | acquire+release pairs/s | vs the limit |\n|---|---:|---:|\n")
	for _, r := range rows {
		w("| %s | %.0f | %s |\n", r.name, r.distinct, ratio(r.distinct, lim.distinct))
	}
	w("\nThe limit is two bare `EVALSHA` round trips per pair through go-redis (a `SET NX PX` script and an owner-checked `DEL`\n")
	w("script): no token, no waiting; the counter-token limit is the same with a counter `INCR`ed by the first. `redis-benchmark` running fence's acquire script over 64 connections: %s requests/s\n", redisBench)
	w("(one round trip each, so about half that in pairs, with no client library in the way).\n\n")
	w("## Allocations per acquire + release\n\n| library | allocations |\n|---|---:|\n")
	for _, r := range rows {
		w("| %s | %.1f |\n", r.name, r.allocs)
	}
	w("\nCounted with `runtime.MemStats.Mallocs` over %d pairs in a row; background goroutines of a library count too.\n\n", n)
	if obs != nil {
		w("## What observing costs\n\n")
		w("The row \"%s\" is fence with `fence.NopObserver{}` set in its options, so that every acquisition, release and\n", obs.name)
		w("lost lease goes through the `fence.Observer` interface to methods that do nothing; \"fence (sync off)\" has no Observer.\n")
		w("Uncontended p50 %s µs against %s µs (%s), allocations %.1f against %.1f, distinct keys %s.\n\n",
			us(obs.p50), us(off.p50), ratio(float64(obs.p50), float64(off.p50)), obs.allocs, off.allocs, ratio(obs.distinct, off.distinct))
	}

	w("## Redlock: 3 and 5 independent masters\n\n")
	w("fence's `redlock` beside go-redsync/redsync's Redlock, each over its own go-redis client per node, on %d independent\n", 5)
	w("`redis-server` processes (no replication between them; the 3-master rows use the first 3). Both ask the nodes in\n")
	w("parallel; fence also issues a fencing token agreed by the majority (written back to nodes that answered a smaller\n")
	w("one). Both with their defaults and a 10 s lease: fence waits with `fence.Wait` (a random pause around 100 ms between\n")
	w("tries), redsync with its 32 tries 50–250 ms apart, called again until it succeeds. Latency and allocations over %d\n", n)
	w("pairs; the contended workload is the one above (32 goroutines, one key, %v).\n\n", dur)
	w("| library | p50 µs | p99 µs | p50 vs redsync | holder changes/s | vs redsync | acquisitions/s | p99 handoff ms | allocations |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, r := range rl {
		peer := rl[i/2*2+1]
		note := ""
		if r.contendedErr != "" {
			note = " (error: " + r.contendedErr + ")"
		}
		w("| %s%s | %s | %s | %s | %.1f | %s | %.1f | %.1f | %.1f |\n", r.name, note, us(r.p50), us(r.p99), ratio(float64(r.p50), float64(peer.p50)),
			r.changes, ratio(r.changes, peer.changes), r.acqPerSec, r.handoffsP99, r.allocs)
	}
	w("\n## etcd: one server\n\n")
	w("fence's `etcdlock` beside etcd's own `concurrency.Mutex` (client v3.7.3) on one etcd server (etcd's `embed`, built from\n")
	w("internal/etcdserver/etcdmain; no fsync), each library with its own client. etcdlock holds each lock on an etcd lease\n")
	w("of its own (TTL 10 s; a released lock's lease is kept for the next) and returns the key's create revision as the token, with `Done()`; the Mutex has neither. The Mutex is run\n")
	w("as usually used, one session per goroutine, reused from lock to lock, and with a session per lock, which gives each\n")
	w("lock its own etcd lease as etcdlock does. Latency and allocations over %d pairs (every write is a Raft commit);\n", etcdPairs(n))
	w("the contended workload is the one above.\n\n")
	mutex := et[1]
	w("| library | p50 µs | p99 µs | p50 vs Mutex (session per goroutine) | holder changes/s | vs Mutex (session per goroutine) | acquisitions/s | p99 handoff ms | allocations |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range et {
		note := ""
		if r.contendedErr != "" {
			note = " (error: " + r.contendedErr + ")"
		}
		w("| %s%s | %s | %s | %s | %.0f | %s | %.0f | %.1f | %.1f |\n", r.name, note, us(r.p50), us(r.p99), ratio(float64(r.p50), float64(mutex.p50)),
			r.changes, ratio(r.changes, mutex.changes), r.acqPerSec, r.handoffsP99, r.allocs)
	}

	w("\n## Targets\n\n")
	w("The targets of issues 18 (Redis), 14 (Redlock), 15 (etcd) and 19 (the observer), judged on the figures above. A latency ratio is fence's\n")
	w("p50 divided by the peer's (lower is better); a throughput ratio is fence's figure divided by the peer's (higher is\n")
	w("better). A target met or missed by less than the noise (about 20%% on this machine) is not settled by one run.\n\n| issue | target | measured | result |\n|---|---|---:|---|\n")
	t := func(issue, target, measured string, ok bool) {
		w("| %s | %s | %s | %s |\n", issue, target, measured, met(ok))
	}
	ratio := func(a, b float64) string { // three digits: a ratio near a threshold must not round across it
		if b == 0 {
			return "–"
		}
		return fmt.Sprintf("%.3f×", a/b)
	}
	lat := func(a, b *row) string { return ratio(float64(a.p50), float64(b.p50)) }
	t("18", "uncontended p50 ≤ 1.0× bsm/redislock, sync off", lat(off, bsm), float64(off.p50) <= 1.0*float64(bsm.p50))
	t("18", "uncontended p50 ≤ 1.3× bsm/redislock, sync on (1 replica)", lat(on, bsm), float64(on.p50) <= 1.3*float64(bsm.p50))
	w("| 18 | (not a target) the same p50s against the go-redis floor of fence's own round trips (sync off: %s; sync on: %s) | %s, %s | – |\n",
		lim.name, limS.name, lat(off, lim), lat(on, limS))
	w("| 18 | (not a target) the floors against bsm/redislock | %s, %s | – |\n", lat(lim, bsm), lat(limS, bsm))
	w("| 18 | (not a target) the floor with a counter token against bsm/redislock; fence (sync off) against it | %s, %s | – |\n", lat(limT, bsm), lat(off, limT))
	w("| 18 | (not a target) fence's p50 less bsm/redislock's, sync off, against its scripts' server time less bsm's (µs in scripts) | %s µs, %+.1f µs | – |\n",
		signedUS(off.p50-bsm.p50), off.scriptUS-bsm.scriptUS)
	t("18", "contended holder changes/s ≥ 1.5× rueidislock, sync off", ratio(off.changes, rueidis.changes), off.changes >= 1.5*rueidis.changes)
	t("18", "contended holder changes/s ≥ 1.0× rueidislock, sync on", ratio(on.changes, rueidis.changes), on.changes >= 1.0*rueidis.changes)
	best := bsm
	for _, p := range []*row{redsync, rueidis} {
		if p.handoffsP99 < best.handoffsP99 {
			best = p
		}
	}
	t("18", fmt.Sprintf("contended p99 handoff ≤ 0.5× the best peer's (%s, %.2f ms), sync off", best.name, best.handoffsP99),
		fmt.Sprintf("%.2f ms, %s", off.handoffsP99, ratio(off.handoffsP99, best.handoffsP99)), off.handoffsP99 <= 0.5*best.handoffsP99)
	w("| 18 | (not a target) fence's p99 handoff against its own p99 release call, the round trip that hands the lock on, sync off | %s | – |\n",
		ratio(off.handoffsP99, off.releaseP99))
	t("18", "≤ 2 commands sent per contended acquisition, sync off (met within the count's error: the acquisitions in flight at the window's two cuts)",
		fmt.Sprintf("%.3f ± %.3f", off.cmdsPerAcq, off.cmdsSlack), off.cmdsPerAcq <= 2+off.cmdsSlack)
	t("18", "distinct keys ≥ 1.0× two bare EVALSHAs (go-redis), sync off", ratio(off.distinct, lim.distinct), off.distinct >= lim.distinct)
	ru := byName[rueidisRow]
	t("18", "distinct keys: a rueidis adapter ≥ 1.0× rueidislock", ratio(ru.distinct, rueidis.distinct), ru.distinct >= rueidis.distinct)
	t("18", "≤ 30 allocations per acquire+release (go-redis), sync off", fmt.Sprintf("%.1f", off.allocs), off.allocs <= 30)
	t("18", "≤ 30 allocations per acquire+release (go-redis), sync on", fmt.Sprintf("%.1f", on.allocs), on.allocs <= 30)
	for i := 0; i+1 < len(rl); i += 2 {
		f, p := rl[i], rl[i+1]
		t("14", fmt.Sprintf("Redlock p50 ≤ 1.0× redsync's, on %s", strings.Trim(strings.TrimPrefix(f.name, "fence redlock "), "()")), lat(f, p), f.p50 <= p.p50)
	}
	if obs != nil {
		t("19", "a no-op Observer's overhead on uncontended p50 within noise (≤ 1.2× fence without one)", lat(obs, off), float64(obs.p50) <= 1.2*float64(off.p50))
	}
	el := et[0]
	t("15", "etcd uncontended p50 ≤ 1.0× concurrency.Mutex's (session per goroutine)", lat(el, mutex), el.p50 <= mutex.p50)
	t("15", "etcd contended holder changes/s ≥ 1.0× concurrency.Mutex (session per goroutine)", ratio(el.changes, mutex.changes), el.changes >= mutex.changes)
	w(`
## Where fence misses a target, and what would close it

- **Uncontended latency against bsm/redislock's unfenced lock.** The column "µs in scripts" measures, in every run,
  how much longer fence's scripts keep the server than bsm/redislock's: the paragraph under the uncontended table
  sets it beside the two p50s' difference. The counter-token floor (two bare EVALSHAs, the
  first also writing a counter) shows what a token costs on its own, one more key written and replicated: the
  paragraph under the uncontended table gives it against bsm/redislock, and fence against it. In the run of
  2026-12-01 16:50 it was at the plain floor's p50 (133 µs against 134): a counter costs next to nothing, and what
  fence adds over it (1.11×) is the rest of its acquire script (6 calls against 2: the clock floor and TIME, the
  record read before it is written, the queue and revocation checks, 5 keys and 5 arguments) and its client. fence's acquire script also issues the token (TIME,
  GET and SET of the token record, and the revocation check) and, since grant-on-release, looks for a queue of
  waiters before it takes a free lock: a free lock costs 6 calls inside the server against bsm's 1, and the token
  record is one more key written (and replicated). The client side is at 20 allocations (24 with
  sync on), under bsm's 34: fence builds its script commands itself, with the SHA and the keys boxed once, and
  pools the synced acquisition's pipeline. The token cannot move into the lock's own value (the record must outlive the lock, and Redis 7.0 has no
  per-field expiry), and TIME cannot be skipped (a promoted replica that missed the last writes holds an older record:
  only the clock floor keeps its tokens above the lost primary's). With sync on, WAIT waits for the replica's
  acknowledgement, a second hop that no unsynced lock pays: that part is the guarantee's price, and on a loaded
  machine it depends on when the replica's process gets a CPU.
- **Contended holder changes and handoff.** Grant-on-release: waiters queue in Redis, and the release script hands
  the lock and its new token to the first live waiter and names it in its publish; the waiter holds the lease with no
  command of its own. A handoff is one round trip, every acquisition a holder change (FIFO: a releaser cannot take the
  lock straight back ahead of the queue), and an acquisition costs its queued try and its release: 2 commands. Counted
  from a fresh start (as the proxy did until 2026-12-01) it came to 2.01: the subscription's connection (HELLO, CLIENT
  SETINFO twice, SUBSCRIBE) and a second try by each waiter that queued before the subscription was confirmed (a
  grant published in between would not have reached it), once per burst of contention, not per acquisition.
  Where the p99 handoff goes (BenchmarkContended on 2026-12-01, with the waiter's wake-up and return timed inside
  redislock for the occasion): from the subscription's reader having the grant to Acquire's return, p50 3 µs and p99
  35–60 µs (the reader waking the waiter's goroutine, the MAC check, the lease); the other 90%% and more of a p99
  of 0.3–0.8 ms comes before, in the releaser's write, the server's script and publish, and the reader's wake-up,
  processes scheduled on two CPUs shared with other jobs. The handoffs spread smoothly (p50 100–140 µs, p90 about
  1.7×, p99 about 2.5×: no second mode, such as a timer or a confirming try, to cut), and in a quiet round fence's
  p99 (0.28–0.30 ms) is already under rueidislock's (0.34 ms): half the best peer's p99 would be fence's own p60.
  The contended table now shows it in every run: fence's p99 handoff is about its own p99 release call, the one
  round trip that hands the lock on (the handoff ends when the grant's publish, sent with that call's reply, is
  read). To meet the target, one round trip's p99 under this load would have to be half the best peer's handoff.
- **Contended holder changes with sync on.** A grant is written by the releaser's connection, so a WAIT on the
  waiter's proves nothing until the waiter writes. When releaser and waiter share a Locker, as the 32 goroutines of
  this workload do, the Release sends WAIT with its script and hands the grant it covered to the waiter in memory:
  3 commands and one WAIT per acquisition (the queued try, sent without WAIT since nothing it writes is used; the
  release; its WAIT). Before 2026-12-01 afternoon the waiter confirmed the grant with its own acquire script and
  WAIT: 4 commands, and a client round trip more on every handoff (measured then in alternated runs of
  BenchmarkContended: 0.92× rueidislock's holder changes before, 1.17–1.21× after). Between processes the waiter
  still confirms. What remains over sync off is the replica's acknowledgement on every handoff, which rueidislock,
  with no replica sync, does not pay.
- **Distinct-key throughput against two bare EVALSHA calls.** A Locker on a *redis.Client batches concurrent
  script calls (one straight through, the others in pipelines of their own, two in flight), which halves the client's
  and server's per-call costs, so fence at times passes the limit (which sends each EVALSHA alone); what keeps it
  near rather than above is the scripts' own work inside the server (the token record, the queue check that
  grant-on-release added to a free lock's acquisition), on a machine where client and server share two CPUs. The
  figure swings with the machine's state more than the others: 0.91× to 1.26× in two runs on the same code; on
  2026-12-01 0.92× in the morning's make bench (limit 59929 pairs/s) and 1.71× in the afternoon's, with a
  -distinct rerun at once after it giving 1.96× (limit 21449, fence 41988, bsm/redislock 21243): the unbatched
  clients (the limit, bsm/redislock) fell to about a third of their morning's rate while fence fell by a quarter.
  Our guess, not measured: each round trip's system calls cost more that afternoon, and batching sends fewer.
- **Redlock against redsync.** Both fan out in parallel, one round trip per node (the token write-back is skipped
  when every granting node answered the maximum token, the usual case); fence's Acquire decides as soon as a
  majority has granted and its Release as soon as a majority has deleted the lock (redsync waits for every node for
  both), the other nodes' replies handled in the background. Before the two decisions at a majority fence was at
  parity (0.98× and 1.00×); the rest of this bullet is why it was not faster. fence's client now does less per pair than
  redsync's (requests handed to goroutines kept per Locker, whose stacks have grown already; the caller woken once
  per fan-out, not once per reply), so what is left is the servers' work: fence's per-node acquire is the
  token-issuing script (SET NX GET, EXISTS of the revocation mark, GET and SET of the token record, TIME; a held lock
  stops after two calls) where redsync's is a plain SET NX, about 7 µs of server time against 1.5 (INFO
  commandstats): the Lua calls cost 0.2 to 0.6 µs each, the script's own invocation about 2. On two CPUs shared by
  the client and 3 or 5 servers, that time is on the path. With a script that only does SET NX the ratio was
  1.01× (3 masters) and 1.07× (5) in one run, the floor of this client.
- **etcd against concurrency.Mutex on a reused session.** Met (uncontended and contended): etcdlock holds each lock
  on an etcd lease of its own, but a Release whose delete went through keeps that lease for the Locker's next Acquire,
  as a pool of sessions would: 2 Raft commits per acquire+release, as the Mutex's; the create and the delete are
  sent as plain requests on the client's connection (not through clientv3's Txn builder) when the client's KV is
  clientv3's own, attempts are cut by a timer rather than a deadline sent to the member, and one timer per Locker
  starts the watch of its leases that outlive 10 ms.
`)
	w("\n%s", whereTheTimeGoes)
	return b.String()
}
