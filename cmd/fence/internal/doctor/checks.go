package doctor

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/fencekit/fence/cmd/fence/internal/tlsanswer"
)

// check looks at one aspect of the deployment and returns what it found.
type check func(d *deployment) []Finding

// checks are run in this order; Run sorts their findings by severity.
var checks = []check{
	checkReachable,
	checkRole,
	checkConfigReadable,
	checkPersistence,
	checkEviction,
	checkReplicaCounts,
	checkReplicasBehind,
	checkMinReplicas,
	checkSentinel,
	checkCluster,
	checkClockSkew,
	checkCommands,
	checkRedlock,
}

// isSentinel reports whether n is a Redis Sentinel (INFO's redis_mode).
func isSentinel(n *node) bool { return n.info["redis_mode"] == "sentinel" }

// all returns the primaries and the replicas.
func (d *deployment) all() []*node { return append(append([]*node{}, d.primaries...), d.replicas...) }

func checkReachable(d *deployment) []Finding {
	var out []Finding
	for _, addr := range d.unreachable {
		what, effect := "did not answer", "it cannot take over (a replica) or serve its slots (a cluster master) as things stand"
		fix := "check that the node runs and that this host can reach it with the same credentials"
		if d.kind == "redlock" {
			effect = "as things stand it grants no lock, and every acquisition needs a majority of the other masters"
		}
		var ae *authError
		if tlsErr := tlsanswer.Refusal(d.why[addr]); tlsErr != nil {
			// It answered: its certificate did not verify, or it refused
			// the doctor's TLS handshake. "Did not answer" sent users
			// looking for a network fault.
			what = fmt.Sprintf("failed the TLS handshake (%v)", tlsErr)
			effect = "its persistence and eviction settings, which a failover to it brings along, went unchecked"
			fix = "give every node a certificate from a CA this host trusts (--redis-tls-ca or SSL_CERT_FILE names a CA bundle) that names the address the deployment lists it by, or run the doctor against it separately"
			if clientRefused(tlsErr) {
				fix = clientCertFix + ", or run the doctor against it separately"
			}
		} else if errors.As(d.why[addr], &ae) {
			what = fmt.Sprintf("refused the credentials (%v)", ae.error)
			fix = "give this node's user and password in its URL, as the lockers use them"
			if d.kind != "redlock" {
				// A replica (or cluster master) the primary named,
				// opened with the URL's credentials: it answers, it
				// just refuses them, and replication may be fine.
				effect = "its persistence and eviction settings, which a failover to it brings along, went unchecked"
				fix = "give every node of the deployment the user and password of the URL (requirepass, or the same ACL user), or run the doctor against it separately"
			}
		}
		out = append(out, Finding{ID: "node-unreachable", Severity: Warning, Node: addr,
			Why: "a node the deployment lists " + what + ", so the doctor could not audit it, and " + effect,
			Fix: fix})
	}
	return out
}

func checkRole(d *deployment) []Finding {
	var out []Finding
	for _, p := range d.primaries {
		if role := p.info["role"]; role != "master" && role != "" { // "": INFO refused, see checkCommands
			why := "the node is a replica (role " + role + "): every acquisition fails with READONLY, since the lock scripts write"
			fix := "point fence at the primary, or at the sentinels with --redis-sentinel so that it follows failovers"
			if p.config != nil && p.config["replica-read-only"] == "no" {
				// A writable replica runs the scripts: they fail only
				// at WAIT, which a replica refuses; without replica
				// sync they grant a lock the primary never sees.
				why = "the node is a replica (role " + role + ") with replica-read-only no: every acquisition with replica sync on fails (a replica refuses WAIT)"
				if d.cfg.ReplicaSync.Disabled {
					why = "the node is a replica (role " + role + ") with replica-read-only no, and replica sync is off: it grants locks and tokens of its own that never reach its primary, so a client of the primary takes the same lock while a client of this node holds it, and the next resync drops them"
				}
				fix += "; and CONFIG SET replica-read-only yes on every replica"
			}
			out = append(out, Finding{ID: "not-primary", Severity: Critical, Node: p.addr, Why: why, Fix: fix})
		}
		if d.kind == "standalone" && p.info["redis_mode"] == "cluster" {
			// A client of one cluster node: MOVED for the others' slots.
			// A program that hands redislock such a node's cluster client
			// inside a wrapper of its own is refused with replica sync on
			// (redislock.HiddenClusterError): the wrapper hides the
			// cluster, whose client would send WAIT to any node.
			out = append(out, Finding{ID: "standalone-cluster-node", Severity: Critical, Node: p.addr,
				Why: "the node is a Redis Cluster node, given as a standalone primary: a client of this node alone gets MOVED for every lock whose slot another master serves, the replica audit reads this node's record rather than the cluster's node table, and redislock refuses replica sync on a client of its own type that hides a cluster client (HiddenClusterError), since that client would send WAIT to a node of its choosing",
				Fix: "audit and lock with --redis-cluster, and pass redislock.New the *redis.ClusterClient itself, not a wrapper of it"})
		}
		if d.kind == "standalone" && isSentinel(p) {
			// A sentinel refuses EVAL, WAIT, CONFIG and ACL as unknown
			// commands: reported one by one, they read as a Redis with
			// its scripting disabled (checkCommands, checkConfigReadable
			// leave a sentinel to this finding).
			out = append(out, Finding{ID: "standalone-sentinel", Severity: Critical, Node: p.addr,
				Why: "the node is a Redis Sentinel, given as a standalone primary: it runs no lock scripts (EVAL, EVALSHA and WAIT are unknown commands there), so every acquisition fails, and the primary it monitors went unaudited",
				Fix: "audit and lock through the sentinels with --redis-sentinel redis-sentinel://HOST:PORT?master_name=NAME, or give --redis the primary's address"})
		}
	}
	return out
}

func checkConfigReadable(d *deployment) []Finding {
	var out []Finding
	what, names := "persistence, eviction and min-replicas settings", "save, appendonly, appendfsync, maxmemory-policy and min-replicas-to-write"
	if d.cluster != nil {
		// checkCluster reads cluster-node-timeout from CONFIG GET too.
		what, names = "persistence, eviction, min-replicas and cluster-node-timeout settings", "save, appendonly, appendfsync, maxmemory-policy, min-replicas-to-write and cluster-node-timeout"
	}
	for _, n := range d.all() {
		if n.configErr != nil && !isSentinel(n) { // a sentinel: see checkRole, checkRedlock
			out = append(out, Finding{ID: "config-unreadable", Severity: Warning, Node: n.addr,
				Why: fmt.Sprintf("CONFIG GET was refused (%v), so %s, each of which can lose locks, went unchecked", n.configErr, what),
				Fix: "run the doctor as a user allowed CONFIG GET, or check " + names + " in the provider's console"})
		}
	}
	return out
}

// clockFloor states what a token record lost to a restart leaves fence
// relying on.
const clockFloor = "tokens then restart from the server's clock in microseconds, which stays above the lost ones only if this node's clock never goes backwards across the restart"

func checkPersistence(d *deployment) []Finding {
	var out []Finding
	for _, n := range d.all() {
		if n.config == nil {
			continue
		}
		aof := n.config["appendonly"] == "yes"
		switch {
		case !aof && n.config["save"] == "":
			out = append(out, Finding{ID: "persistence-off", Severity: Critical, Node: n.addr,
				Why: "persistence is off (save \"\", appendonly no): a restart comes back empty, so every held lock is free to a second holder while the first still runs, and every token record is lost; " + clockFloor,
				Fix: "CONFIG SET appendonly yes, CONFIG SET appendfsync always, CONFIG REWRITE; or accept it only where a lost lock is harmless because the resource checks tokens"})
		case !aof:
			out = append(out, Finding{ID: "persistence-snapshot", Severity: Warning, Node: n.addr,
				Why: "only RDB snapshots (save " + strconv.Quote(n.config["save"]) + "): a restart loses every lock and token taken since the last snapshot, so a second holder can take a lock the first still holds; " + clockFloor,
				Fix: "CONFIG SET appendonly yes and appendfsync always"})
		case n.config["appendfsync"] != "always":
			out = append(out, Finding{ID: "appendfsync", Severity: Warning, Node: n.addr,
				Why: "appendfsync " + n.config["appendfsync"] + ": a crash of the host (power, kernel) loses the acquisitions of the last second or so, so a lock still held can be granted again; " + clockFloor,
				Fix: "CONFIG SET appendfsync always (each write is fsynced before the reply)"})
		case n.config["no-appendfsync-on-rewrite"] == "yes":
			// Redis skips the fsync, appendfsync always included,
			// while a child process (AOF rewrite, RDB save) runs.
			out = append(out, Finding{ID: "appendfsync", Severity: Warning, Node: n.addr,
				Why: "appendfsync always with no-appendfsync-on-rewrite yes: while an AOF rewrite or RDB save runs, Redis skips the fsync, so a crash of the host then loses the acquisitions of up to the last 30 s or so, and a lock still held can be granted again; " + clockFloor,
				Fix: "CONFIG SET no-appendfsync-on-rewrite no"})
		}
	}
	return out
}

func checkEviction(d *deployment) []Finding {
	var out []Finding
	for _, n := range d.all() {
		if n.config == nil || n.config["maxmemory"] == "0" || n.config["maxmemory-policy"] == "noeviction" {
			continue
		}
		policy := n.config["maxmemory-policy"]
		what := "lock keys, which carry a TTL,"
		if strings.HasPrefix(policy, "allkeys-") {
			what = "any key, lock keys, token records and the replica record included,"
		}
		out = append(out, Finding{ID: "eviction", Severity: Critical, Node: n.addr,
			Why: "maxmemory " + n.config["maxmemory"] + " with maxmemory-policy " + policy + " evicts " + what + " under memory pressure: an evicted lock is granted to a second holder while the first still runs, and an evicted token record makes the next token the server's clock in microseconds, above the evicted one only if this node's clock has not gone backwards since it was issued",
			Fix: "CONFIG SET maxmemory-policy noeviction (acquisitions then fail with OOM instead of breaking), or give fence a Redis of its own"})
	}
	return out
}

func checkReplicaCounts(d *deployment) []Finding {
	if d.kind == "redlock" {
		return nil // Redlock waits for no replica: see checkRedlock
	}
	var out []Finding
	rs := d.cfg.ReplicaSync
	for _, p := range d.primaries {
		if p.info["role"] != "master" {
			continue
		}
		if p.countsErr != nil && !strings.Contains(p.countsErr.Error(), "NOPERM") { // NOPERM: see checkCommands
			out = append(out, Finding{ID: "replica-record", Severity: Critical, Node: p.addr,
				Why: fmt.Sprintf("the replica record cannot be read (%v): every acquisition with replica sync on fails", p.countsErr),
				Fix: "delete the key " + d.cfg.Prefix + ":replicas or set it with redislock's Locker.SetExpectedReplicas"})
			continue
		}
		connected := p.connected()
		expected := connected
		if p.counts != nil {
			expected = p.counts.Expected
		}
		if d.kind == "cluster" {
			expected = max(connected, p.clusterReplicas)
			if rs.Replicas > 0 {
				expected = rs.Replicas
			}
		}
		need := rs.Required(expected)
		if p.syncErr != nil && need > 0 {
			out = append(out, Finding{ID: "read-timeout", Severity: Critical, Node: p.addr,
				Why: fmt.Sprintf("the primary has replicas and fence's lockers refuse every acquisition on this client with replica sync on (%v): every fence exec with these options exits 2", p.syncErr),
				Fix: "raise the URL's read_timeout (2.1s or more keeps WAIT's 1 s timeout), or turn replica sync off (--no-replica-sync) where a lost lock is harmless"})
		}
		switch {
		case expected == 0 && d.kind == "cluster":
			// checkCluster reports a master without replicas.
		case expected == 0:
			out = append(out, Finding{ID: "no-replicas", Severity: Info, Node: p.addr,
				Why: "the primary has no replicas: replica sync has nothing to wait for (redislock requires 0 acknowledgements when it expects 0 replicas, so acquisitions succeed), and a crash of this node stops all locking until it is back, with what persistence kept",
				Fix: "add a replica (with Sentinel or Cluster for failover) if locking must survive the loss of this node"})
		case rs.Disabled:
			out = append(out, Finding{ID: "replica-sync-off", Severity: Warning, Node: p.addr,
				Why: fmt.Sprintf("the primary has %d replica(s) but replica sync is off: a failover to a replica that had not received an acquisition grants that lock again while its holder still runs", expected),
				Fix: "turn replica sync on (drop --no-replica-sync), and have the resource check tokens"})
		case need > expected:
			out = append(out, Finding{ID: "acks-unmeetable", Severity: Critical, Node: p.addr,
				Why: fmt.Sprintf("the acknowledgement rule requires %d replicas but the primary is expected to have %d: every acquisition is refused (fence.ErrNotReplicated)", need, expected),
				Fix: "lower --acks (or use majority), or add replicas"})
		case connected < need:
			out = append(out, Finding{ID: "replicas-missing", Severity: Critical, Node: p.addr,
				Why: fmt.Sprintf("%d of %d expected replicas are connected and %d must acknowledge: every acquisition waits its WAIT timeout and is refused (fence.ErrNotReplicated)", connected, expected, need),
				Fix: "bring the missing replicas back, or, if they were decommissioned, lower the record with redislock's Locker.SetExpectedReplicas (on a cluster: CLUSTER FORGET)"})
		case connected < expected:
			out = append(out, Finding{ID: "replicas-missing", Severity: Warning, Node: p.addr,
				Why: fmt.Sprintf("%d of %d expected replicas are connected: acquisitions still get their %d acknowledgement(s), but one more loss refuses them all", connected, expected, need),
				Fix: "bring the missing replicas back, or lower the record with redislock's Locker.SetExpectedReplicas if they were decommissioned"})
		}
	}
	return out
}

// maxLag is the replica lag (seconds since its last acknowledgement, which
// replicas send every second) beyond which a replica is behind.
const maxLag = 1

func checkReplicasBehind(d *deployment) []Finding {
	if d.kind == "redlock" {
		return nil // Redlock waits for no replica: see checkRedlock
	}
	var out []Finding
	for _, p := range d.primaries {
		for _, r := range p.replicaLines() {
			if r.state != "online" || r.lag > maxLag {
				out = append(out, Finding{ID: "replica-behind", Severity: Warning, Node: r.addr,
					Why: fmt.Sprintf("the replica is %s with lag %d s (primary %s): it does not acknowledge within WAIT's timeout, so acquisitions that need it are refused, and a failover to it loses the locks it missed", r.state, r.lag, p.addr),
					Fix: "check the replica's host and network; a replica that is paused or syncing is not a safe failover target"})
			}
		}
	}
	if sv := d.sentinel; sv != nil {
		for _, r := range sv.downReplicas {
			out = append(out, Finding{ID: "replica-down", Severity: Warning, Node: r.addr,
				Why: fmt.Sprintf("the sentinels list this replica of %s as down (flags %s, link %s): it receives no acquisitions, and while it is expected acquisitions that need its acknowledgement are refused", sv.master, r.flags, r.link),
				Fix: "bring it back, or, if it was decommissioned, SENTINEL RESET the master's name and lower fence's record with Locker.SetExpectedReplicas"})
		}
	}
	return out
}

func checkMinReplicas(d *deployment) []Finding {
	if d.kind == "redlock" {
		return nil // Redlock waits for no replica: see checkRedlock
	}
	var out []Finding
	for _, p := range d.primaries {
		if p.config == nil || p.info["role"] != "master" {
			continue
		}
		toWrite, _ := strconv.Atoi(p.config["min-replicas-to-write"])
		// Redis applies min-replicas-to-write only with a max lag: 0
		// turns the rule off, and the primary takes every write.
		// (Read as set, it was a false "refuses every write" on a primary
		// that took them, and no finding where one was due.)
		rule := "min-replicas-to-write is 0"
		if lag, err := strconv.Atoi(p.config["min-replicas-max-lag"]); err == nil && lag == 0 && toWrite > 0 {
			toWrite, rule = 0, "min-replicas-max-lag is 0, which turns min-replicas-to-write "+strconv.Itoa(toWrite)+" off"
		}
		connected := p.connected()
		good := connected
		if g, err := strconv.Atoi(p.info["min_slaves_good_slaves"]); err == nil {
			good = g // connected with a lag within min-replicas-max-lag
		}
		switch {
		case toWrite > good:
			out = append(out, Finding{ID: "min-replicas", Severity: Critical, Node: p.addr,
				Why: fmt.Sprintf("min-replicas-to-write %d but %d replicas are connected with a lag within min-replicas-max-lag (%s s): the primary refuses every write (NOREPLICAS), so every acquisition fails", toWrite, good, p.config["min-replicas-max-lag"]),
				Fix: "bring replicas back, or lower min-replicas-to-write"})
		case toWrite == 0 && connected > 0:
			sev := Info
			why := rule + ": a primary cut off from its replicas keeps accepting writes that a failover will lose; fence's replica sync refuses the acquisitions and renewals it cannot confirm there, so only locks taken with replica sync off are exposed"
			if d.cfg.ReplicaSync.Disabled {
				sev = Warning
				why = rule + ", and replica sync is off: a primary cut off from its replicas keeps granting locks that a failover will lose, and the promoted replica grants them again"
			}
			out = append(out, Finding{ID: "min-replicas", Severity: sev, Node: p.addr, Why: why,
				Fix: "CONFIG SET min-replicas-to-write 1 and min-replicas-max-lag 10 (writes stop on a primary that lost its replicas)"})
		}
	}
	return out
}

func checkSentinel(d *deployment) []Finding {
	sv := d.sentinel
	if sv == nil {
		return nil
	}
	var out []Finding
	if len(sv.named) > 1 {
		var views []string
		for _, p := range slices.Sorted(maps.Keys(sv.named)) {
			views = append(views, p+" (by "+strings.Join(sv.named[p], ", ")+")")
		}
		out = append(out, Finding{ID: "sentinel-split", Severity: Critical, Node: sv.master,
			Why: fmt.Sprintf("the sentinels name different primaries for %s: %s; a client takes the primary of whichever sentinel answers first, so clients lock on different primaries and two of them hold one lock at once, with tokens from unrelated counters; the doctor audited only %s", sv.master, strings.Join(views, "; "), sv.from+"'s"),
			Fix: fmt.Sprintf("list only the sentinels of one deployment in --redis-sentinel, and have every sentinel monitor the same primary (SENTINEL REMOVE %s and SENTINEL MONITOR on the odd ones, or give each deployment its own master name)", sv.master)})
	}
	reach := len(sv.addrs) - len(sv.unreachable)
	if len(sv.unreachable) > 0 {
		// A failover needs the quorum to agree the primary is down and a
		// majority of all sentinels to authorise it.
		need := max(sv.quorum, max(sv.known, len(sv.addrs))/2+1)
		sev, effect := Warning, "fence cannot find the primary through them after a failover, and each one lost brings the sentinels closer to being unable to fail over"
		if reach < need {
			sev, effect = Critical, fmt.Sprintf("fewer than the %d needed to agree and authorise a failover, so a crash of the primary stops all locking", need)
		}
		fix := "restart the sentinels or fix the addresses in --redis-sentinel"
		var failed []string
		verify, refused := false, false
		for _, addr := range sv.unreachable {
			if err := sv.tlsFailed[addr]; err != nil {
				failed = append(failed, fmt.Sprintf("%s failed the TLS handshake (%v)", addr, err))
				if clientRefused(err) {
					refused = true
				} else {
					verify = true
				}
			}
		}
		if len(failed) > 0 {
			// They answered: "unreachable" alone sent users looking for
			// a network fault.
			effect = strings.Join(failed, "; ") + "; " + effect
			if verify {
				fix += "; give every sentinel a certificate from a CA this host trusts (--redis-tls-ca or SSL_CERT_FILE names a CA bundle) that names the address --redis-sentinel gives it"
			}
			if refused {
				fix += "; " + clientCertFix
			}
		}
		out = append(out, Finding{ID: "sentinel-unreachable", Severity: sev, Node: sv.master,
			Why: fmt.Sprintf("%d of %d sentinels answered (unreachable: %s): %s", reach, len(sv.addrs), strings.Join(sv.unreachable, ", "), effect),
			Fix: fix})
	}
	if sv.ckquorum != nil {
		out = append(out, Finding{ID: "sentinel-quorum", Severity: Critical, Node: sv.master,
			Why: fmt.Sprintf("SENTINEL CKQUORUM on %s: %v: no failover can be authorised, so a crash of the primary stops all locking", sv.from, sv.ckquorum),
			Fix: "run at least three sentinels, on separate hosts, with a quorum they can reach"})
	} else if sv.quorum <= sv.known/2 {
		out = append(out, Finding{ID: "sentinel-quorum", Severity: Warning, Node: sv.master,
			Why: fmt.Sprintf("quorum %d of %d sentinels is not a majority: a minority that lost sight of the primary marks it down, and failovers (each one a chance to lose locks the promoted replica missed) start on a partial view", sv.quorum, sv.known),
			Fix: fmt.Sprintf("SENTINEL SET %s quorum %d on every sentinel", sv.master, sv.known/2+1)})
	} else if sv.known < 3 {
		// One sentinel is its own majority: its view alone fails the
		// primary over. Two need each other to authorise any failover.
		out = append(out, Finding{ID: "sentinel-quorum", Severity: Warning, Node: sv.master,
			Why: fmt.Sprintf("only %d sentinel(s) monitor the master: one that loses sight of the primary, or is down, decides alone whether a failover (each one a chance to lose locks the promoted replica missed) starts, or whether any can; a failover needs a majority of the sentinels to authorise it", sv.known),
			Fix: fmt.Sprintf("run at least three sentinels on separate hosts, with SENTINEL SET %s quorum 2", sv.master)})
	}
	if sv.downAfter < d.cfg.LeaseTime {
		out = append(out, Finding{ID: "sentinel-down-after", Severity: Warning, Node: sv.master,
			Why: fmt.Sprintf("down-after-milliseconds %d is shorter than the lease time %v: a failover completes while leases granted by the old primary still run, so a lock the promoted replica missed is granted to a second holder while the first still works, and only tokens checked by the resource stop its stale writes", sv.downAfter.Milliseconds(), d.cfg.LeaseTime),
			Fix: fmt.Sprintf("SENTINEL SET %s down-after-milliseconds %d, or shorter leases (--watchdog-ttl), and check tokens at the resource", sv.master, d.cfg.LeaseTime.Milliseconds())})
	}
	return out
}

// failoverTimeout returns how long, by the masters' cluster-node-timeout
// settings, master p goes unanswered before it is flagged failing and its
// replica may take over: each master flags it after its own timeout, and
// Redis fails it once a majority of the masters (p not among them) has,
// so the majority-th shortest of the other masters' timeouts, not p's own.
// It reports false when the settings are unknown (CONFIG GET refused) or
// too few masters are read to make that majority.
func failoverTimeout(masters []*node, p *node) (int, bool) {
	var others []int
	for _, m := range masters {
		if m == p {
			continue
		}
		ms, err := strconv.Atoi(m.config["cluster-node-timeout"])
		if err != nil || ms <= 0 {
			continue
		}
		others = append(others, ms)
	}
	need := len(masters)/2 + 1
	if len(others) < need {
		// The others' settings unknown, or a cluster of one or two
		// masters (which no majority of others can fail over): p's
		// own, as the shortest it can be.
		ms, err := strconv.Atoi(p.config["cluster-node-timeout"])
		return ms, err == nil && ms > 0
	}
	slices.Sort(others)
	return others[need-1], true
}

func checkCluster(d *deployment) []Finding {
	cv := d.cluster
	if cv == nil {
		return nil
	}
	var out []Finding
	if cv.slotsOK < 16384 || cv.state != "ok" {
		out = append(out, Finding{ID: "cluster-slots", Severity: Critical, Node: strings.Join(d.cfg.Cluster.Addrs, ","),
			Why: fmt.Sprintf("%d of 16384 slots are served (cluster_state %s): locks whose names hash to the others fail with CLUSTERDOWN, and with cluster-require-full-coverage every lock does", cv.slotsOK, cv.state),
			Fix: "assign the missing slots (redis-cli --cluster fix) or bring their masters back"})
	}
	for _, p := range d.primaries {
		switch {
		case p.clusterReplicas == 0:
			out = append(out, Finding{ID: "cluster-replicas", Severity: Warning, Node: p.addr,
				Why: "the master has no replica: if it fails, its slots stay down and the locks in them cannot be taken until it returns, with what its persistence kept",
				Fix: "add a replica per master (redis-cli --cluster add-node --cluster-slave)"})
		case p.clusterFailed > 0:
			out = append(out, Finding{ID: "cluster-replicas", Severity: Warning, Node: p.addr,
				Why: fmt.Sprintf("%d of the master's %d replicas are flagged fail: they still count as expected, so acquisitions that need them are refused, and they cannot take over", p.clusterFailed, p.clusterReplicas),
				Fix: "bring them back, or CLUSTER FORGET the decommissioned ones"})
		}
		// The same gap as Sentinel's down-after-milliseconds: a replica
		// takes over once the master is flagged failing.
		if ms, ok := failoverTimeout(d.primaries, p); ok && time.Duration(ms)*time.Millisecond < d.cfg.LeaseTime {
			out = append(out, Finding{ID: "cluster-node-timeout", Severity: Warning, Node: p.addr,
				Why: fmt.Sprintf("the master is failed over once a majority of the masters has flagged it, each after its own cluster-node-timeout: here after %d ms, shorter than the lease time %v: a replica takes the master's slots over while leases it granted still run, so a lock the promoted replica missed is granted to a second holder while the first still works, and only tokens checked by the resource stop its stale writes", ms, d.cfg.LeaseTime),
				Fix: fmt.Sprintf("CONFIG SET cluster-node-timeout %d on every node, or shorter leases (--watchdog-ttl), and check tokens at the resource", d.cfg.LeaseTime.Milliseconds())})
		}
	}
	return out
}

// defaultMaxSkew is the clock difference tolerated when the deployment
// states no failover time.
const defaultMaxSkew = time.Second

func checkClockSkew(d *deployment) []Finding {
	limit := d.cfg.MaxSkew
	if limit == 0 {
		limit = defaultMaxSkew
		if d.sentinel != nil && d.sentinel.downAfter > 0 {
			limit = d.sentinel.downAfter
		}
		if d.kind == "cluster" && len(d.primaries) > 0 && d.primaries[0].config != nil {
			if ms, err := strconv.Atoi(d.primaries[0].config["cluster-node-timeout"]); err == nil && ms > 0 {
				limit = time.Duration(ms) * time.Millisecond
			}
		}
	}
	var lo, hi *node
	for _, n := range d.all() {
		if n.timeErr != nil {
			continue
		}
		if lo == nil || n.offset < lo.offset {
			lo = n
		}
		if hi == nil || n.offset > hi.offset {
			hi = n
		}
	}
	if lo == nil || lo == hi {
		return nil
	}
	// The smallest skew the readings allow, given each round trip.
	skew := hi.offset - lo.offset - hi.uncertainty - lo.uncertainty
	if skew <= limit {
		return nil
	}
	if d.kind == "redlock" {
		return []Finding{{ID: "clock-skew", Severity: Warning, Node: hi.addr,
			Why: fmt.Sprintf("its clock is at least %v ahead of %s's, more than %v: Redlock assumes the masters' clocks agree within the time a crashed master stays down, because each master's token floor is its own clock, so a master that comes back empty with its clock behind the others can issue tokens below ones already issued, and only the write-back on the rest of a majority keeps them in order", skew.Round(time.Millisecond), lo.addr, limit),
			Fix: "run NTP (chrony) on every Redis host so their clocks agree within a few milliseconds"}}
	}
	return []Finding{{ID: "clock-skew", Severity: Warning, Node: hi.addr,
		Why: fmt.Sprintf("its clock is at least %v ahead of %s's, more than the %v a failover takes at least: the token floor is each server's clock, so after a failover that loses a token record the new primary can issue tokens below ones already issued, and the resource then orders a stale holder's writes after the new holder's", skew.Round(time.Millisecond), lo.addr, limit),
		Fix: "run NTP (chrony) on every Redis host so their clocks agree within a few milliseconds"}}
}

// commands fence cannot work without, and what their loss breaks.
var commandNeeds = map[string]string{
	"EVAL":    "every acquisition, renewal and release is a Lua script",
	"EVALSHA": "every acquisition, renewal and release is a Lua script sent by its SHA first",
	"WAIT":    "replica sync confirms acquisitions with WAIT, so with replicas every acquisition fails",
	"INFO":    "the replica count script reads INFO replication, so replica sync fails",
}

func checkCommands(d *deployment) []Finding {
	var out []Finding
	for _, p := range d.primaries {
		if isSentinel(p) {
			// Its unknown commands are not a Redis with scripting
			// disabled: standalone-sentinel or redlock-not-standalone
			// says what it is.
			continue
		}
		denied := maps.Clone(p.denied)
		if denied == nil {
			denied = map[string]string{}
		}
		for _, cmd := range []string{"EVAL", "EVALSHA", "WAIT", "INFO"} {
			err := p.probes[cmd]
			switch {
			case err == nil:
			case strings.HasPrefix(err.Error(), "NOPERM") || strings.Contains(err.Error(), "user executing the script can't run"):
				denied[deniedCommand(err, cmd)] = err.Error()
			default:
				out = append(out, Finding{ID: "command-missing", Severity: Critical, Node: p.addr,
					Why: fmt.Sprintf("%s fails (%v): %s", cmd, err, commandNeeds[cmd]),
					Fix: "use a Redis (or a plan of the managed service) where " + cmd + " is enabled and not renamed"})
			}
		}
		if why, ok := denied["RENAME"]; ok {
			// The release script deletes the lock when RENAME is refused
			// (release.lua): only its released-by record is lost.
			delete(denied, "RENAME")
			out = append(out, Finding{ID: "rename-denied", Severity: Warning, Node: p.addr,
				Why: fmt.Sprintf("the ACL user may not run RENAME on fence's keys (%s): a lease's Release deletes the lock without its released-by record, so a Release whose reply is lost with its connection, and that the client sends again, reports the lease lost though it released the lock", why),
				Fix: fmt.Sprintf("ACL SETUSER <user> +rename ~%s:*", d.cfg.Prefix)})
		}
		if len(denied) > 0 {
			cmds := slices.Sorted(maps.Keys(denied))
			var grant []string
			for _, c := range cmds {
				grant = append(grant, "+"+strings.ToLower(c))
			}
			out = append(out, Finding{ID: "command-denied", Severity: Critical, Node: p.addr,
				Why: fmt.Sprintf("the ACL user may not run %s on fence's keys and channels (%s: %s): the acquisitions, renewals, releases or waits that send them fail", strings.Join(cmds, ", "), cmds[0], denied[cmds[0]]),
				Fix: fmt.Sprintf("ACL SETUSER <user> %s ~%s:* &%s:*", strings.Join(grant, " "), d.cfg.Prefix, d.cfg.Prefix)})
		}
		if p.aclErr != nil && !strings.Contains(p.aclErr.Error(), "unknown") {
			out = append(out, Finding{ID: "acl-unchecked", Severity: Info, Node: p.addr,
				Why: fmt.Sprintf("ACL DRYRUN was refused (%v), so the user's permissions on fence's keys (SET, DEL, PEXPIRE, PUBLISH, SUBSCRIBE) went unchecked; a denied one fails acquisitions or waits", p.aclErr),
				Fix: "run the doctor once as a user allowed ACL DRYRUN, or check the user's rules with ACL GETUSER"})
		}
	}
	return out
}

// deniedCommand is the command that the NOPERM err, met by the probe of
// cmd, names: the INFO probe runs INFO inside an EVAL, and a user denied
// EVAL alone gets EVAL's NOPERM from it ("no permissions to run the 'eval'
// command"), which is no word about INFO. A refusal inside a probe's
// script ("can't run this command ... on @user_script:N") names no
// command, only the line: the one that line of cmd's script calls, not
// cmd, which the user may run (TestDeniedCommandInsideProbeScript). A
// refusal that names neither is cmd's.
func deniedCommand(err error, cmd string) string {
	_, after, ok := strings.Cut(err.Error(), "to run the '")
	named, _, closed := strings.Cut(after, "'")
	if ok && closed && named != "" {
		return strings.ToUpper(named)
	}
	script := probeScripts[cmd]
	if cmd == "EVALSHA" {
		script = probeScripts["EVAL"]
	}
	_, after, ok = strings.Cut(err.Error(), "@user_script:")
	line, bad := strconv.Atoi(after[:len(after)-len(strings.TrimLeftFunc(after, unicode.IsDigit))])
	lines := strings.Split(script, "\n")
	if !ok || bad != nil || line < 1 || line > len(lines) {
		return cmd
	}
	_, after, ok = strings.Cut(lines[line-1], "redis.call('")
	named, _, closed = strings.Cut(after, "'")
	if !ok || !closed || named == "" {
		return cmd
	}
	return named
}

// checkRedlock checks what Redlock's safety rests on beyond each master's
// own audit (see redlock's package doc): enough masters, an odd number,
// independent of one another, and a crashed master that cannot rejoin
// with its locks forgotten.
func checkRedlock(d *deployment) []Finding {
	if d.kind != "redlock" {
		return nil
	}
	var out []Finding
	var addrs []string
	for _, o := range d.cfg.Redlock {
		addrs = append(addrs, o.Addr)
	}
	all := strings.Join(addrs, ",")
	n := len(addrs)
	majority := n/2 + 1
	switch {
	case n < 3:
		out = append(out, Finding{ID: "redlock-too-few", Severity: Warning, Node: all,
			Why: fmt.Sprintf("%d master(s): a majority is %d, so one master down or slow stops all locking, and Redlock tolerates no failure at all", n, majority),
			Fix: "use 3 or 5 independent masters, on separate hosts"})
	case n%2 == 0:
		out = append(out, Finding{ID: "redlock-even", Severity: Info, Node: all,
			Why: fmt.Sprintf("%d masters: a majority is %d, so it tolerates %d failure(s), no more than %d masters would, with one more node to fail and to wait for", n, majority, n-majority, n-1),
			Fix: fmt.Sprintf("use %d or %d masters", n-1, n+1)})
	}
	// A master counts if it answered and can grant: not a replica
	// (READONLY), a cluster node or a sentinel (redlock-not-standalone).
	reach := 0
	for _, p := range d.primaries {
		if p.info["role"] != "slave" && p.info["redis_mode"] != "cluster" && p.info["redis_mode"] != "sentinel" {
			reach++
		}
	}
	if reach < majority {
		out = append(out, Finding{ID: "redlock-no-majority", Severity: Critical, Node: all,
			Why: fmt.Sprintf("%d of %d masters answered and can grant a lock, fewer than the majority of %d: every acquisition fails", reach, n, majority),
			Fix: "bring the masters back, or fix their addresses"})
	}
	// The same server under two addresses (or one address twice), and
	// masters of one replication stream, count twice towards a majority.
	byRun, byRepl := map[string][]string{}, map[string][]string{}
	for _, p := range d.primaries {
		if id := p.info["run_id"]; id != "" {
			byRun[id] = append(byRun[id], p.addr)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(byRun)) {
		if same := byRun[id]; len(same) > 1 {
			out = append(out, Finding{ID: "redlock-not-independent", Severity: Critical, Node: strings.Join(same, ","),
				Why: fmt.Sprintf("these addresses are one redis-server (run_id %s): its grant counts %d times towards the majority, so two clients can each count a majority and hold the lock at once", id[:min(8, len(id))], len(same)),
				Fix: "list each master once, and only independent masters (separate hosts, no replication between them)"})
		}
	}
	seenRun := map[string]bool{}
	for _, p := range d.primaries {
		id, repl := p.info["run_id"], p.info["master_replid"]
		if seenRun[id] || repl == "" {
			continue
		}
		seenRun[id] = true
		byRepl[repl] = append(byRepl[repl], p.addr)
	}
	for _, repl := range slices.Sorted(maps.Keys(byRepl)) {
		if same := byRepl[repl]; len(same) > 1 {
			slices.Sort(same)
			out = append(out, Finding{ID: "redlock-not-independent", Severity: Critical, Node: strings.Join(same, ","),
				Why: "these masters are one replication group (one replicates the other, sharing its master_replid): a lock they grant counts twice towards the majority, and a grant one of them misses reaches it by replication or never, so two clients can each count a majority",
				Fix: "make each Redlock master a primary of its own (REPLICAOF NO ONE) and list only independent ones"})
		}
	}
	for _, p := range d.primaries {
		switch p.info["redis_mode"] {
		case "cluster":
			out = append(out, Finding{ID: "redlock-not-standalone", Severity: Critical, Node: p.addr,
				Why: "the node is a Redis Cluster node: redlock sends each master plain commands, so this one answers MOVED for every lock whose slot it does not serve and never grants it, and the cluster's failover promotes replicas that may have missed a grant",
				Fix: "give Redlock standalone redis-servers (cluster-enabled no), or use redislock on the cluster with --redis-cluster"})
		case "sentinel":
			out = append(out, Finding{ID: "redlock-not-standalone", Severity: Critical, Node: p.addr,
				Why: "the node is a Redis Sentinel, not a master: it refuses the lock scripts, so it never grants a lock and every acquisition needs a majority of the others",
				Fix: "list the masters themselves, or use redislock through the sentinels with --redis-sentinel"})
		}
	}
	var weak []string
	for _, p := range d.primaries {
		if c := p.connected(); c > 0 {
			out = append(out, Finding{ID: "redlock-replica", Severity: Warning, Node: p.addr,
				Why: fmt.Sprintf("the master has %d replica(s): Redlock does not wait for them, so a failover to one that missed an acquisition forgets that lock, and a second client can win a majority while the first holds it", c),
				Fix: "run Redlock masters without failover (no Sentinel or Cluster promoting their replicas), or use redislock with replica sync on one replicated primary"})
		}
		if p.config != nil && (p.config["appendonly"] != "yes" || p.config["appendfsync"] != "always" || p.config["no-appendfsync-on-rewrite"] == "yes") {
			weak = append(weak, p.addr)
		}
	}
	if len(weak) > 0 {
		slices.Sort(weak)
		out = append(out, Finding{ID: "redlock-restart", Severity: Warning, Node: strings.Join(weak, ","),
			Why: fmt.Sprintf("without appendonly yes and appendfsync always (and no-appendfsync-on-rewrite no), a master that crashes comes back without the locks it granted: unless it stays down at least the lease time (%v) before rejoining, it grants a lock again that a majority counting it already granted, and two clients hold it (Redlock's first assumption); the tokens still tell them apart only if the resource checks them", d.cfg.LeaseTime),
			Fix: fmt.Sprintf("CONFIG SET appendonly yes, appendfsync always and no-appendfsync-on-rewrite no on each master, or make a crashed master stay down at least %v before it restarts (e.g. systemd RestartSec)", d.cfg.LeaseTime)})
	}
	return out
}

// clientCertFix is the fix for a node that refused the doctor's TLS
// handshake with an alert (see clientRefused).
const clientCertFix = "a node that refuses the TLS handshake (certificate required, unknown certificate authority, bad certificate) asks for a client certificate it trusts: give one with --redis-tls-cert and --redis-tls-key, signed by a CA in the node's tls-ca-cert-file, as the lockers use them"

// clientRefused reports whether err, a tlsanswer.Refusal, is the server's alert
// (it refused the handshake, most often the client's certificate: none
// given, or one of a CA it does not trust) rather than this host's
// verification of the server's certificate.
func clientRefused(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}
