package doctor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/cmd/fence/internal/termtext"
	"github.com/fencekit/fence/cmd/fence/internal/tlsanswer"
	"github.com/fencekit/fence/redislock"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// Severity ranks a Finding.
type Severity int

// Severities, from least to most severe.
const (
	Info     Severity = iota + 1 // worth knowing; nothing breaks because of it
	Warning                      // a failure (a restart, a failover, a lag) can break locks or tokens
	Critical                     // locks or tokens are broken now, or every acquisition fails
)

// String returns "info", "warning" or "critical".
func (s Severity) String() string {
	switch s {
	case Info:
		return "info"
	case Warning:
		return "warning"
	case Critical:
		return "critical"
	}
	return "severity(" + strconv.Itoa(int(s)) + ")"
}

// MarshalText encodes the severity as its name, for JSON.
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Finding is one hazard found in the deployment. What a server said, quoted
// in its fields, has its unprintable characters escaped (termtext.Escape).
type Finding struct {
	ID       string   `json:"id"`       // what was found, e.g. "persistence-off"; stable, for scripts
	Severity Severity `json:"severity"` // how bad it is
	Node     string   `json:"node"`     // the node (host:port) or, for Sentinel findings, the master's name
	Why      string   `json:"why"`      // the failure it causes, in one sentence
	Fix      string   `json:"fix"`      // what to change
}

// Worst returns the highest severity among findings, 0 if there are none.
func Worst(findings []Finding) Severity {
	var w Severity
	for _, f := range findings {
		w = max(w, f.Severity)
	}
	return w
}

// Config names the deployment to audit and how fence uses it. Give exactly
// one of Standalone, Sentinel, Cluster and Redlock: the doctor opens its own
// clients from them, one per node, with the same credentials.
type Config struct {
	Standalone *redis.Options         // one primary (its replicas are found through it)
	Sentinel   *redis.FailoverOptions // the sentinels and the master's name
	Cluster    *redis.ClusterOptions  // one or more nodes of a cluster
	// Redlock are the independent masters of a redlock.Locker, each
	// audited as a standalone primary (its replicas aside), plus what
	// Redlock's own assumptions need: enough masters, an odd number of
	// them, truly independent, durable or kept down for a lease time
	// after a crash, with clocks that agree (see redlock's package doc).
	Redlock []*redis.Options

	// Prefix is fence's key prefix (redislock.Options.Prefix). Default
	// redislock.DefaultPrefix, or redlock.DefaultPrefix with Redlock.
	Prefix string
	// LeaseTime is the lease time fence's locks use. Default
	// redislock.DefaultWatchdogTTL (redlock.DefaultWatchdogTTL with
	// Redlock).
	LeaseTime time.Duration
	// ReplicaSync is the acknowledgement rule fence's lockers use
	// (redislock.Options.ReplicaSync); the zero value is redislock's default.
	ReplicaSync redislock.ReplicaSync
	// MaxSkew is the largest clock difference between nodes that the token
	// rule tolerates. Default: the time a failover takes at least
	// (Sentinel's down-after-milliseconds, the cluster's
	// cluster-node-timeout), else 1 s.
	MaxSkew time.Duration
	// Now is the local clock that brackets each node's TIME. Default
	// time.Now.
	Now func() time.Time

	_ struct{}
}

// ErrUnreachable marks an error of Run when the deployment could not be
// read: a primary, every sentinel or every cluster node did not answer.
var ErrUnreachable = errors.New("doctor: deployment unreachable")

// errWrongKind marks an error of a read that found every node given
// answering as another kind of server (a plain redis-server named as a
// sentinel or a cluster seed): the wrong field of Config, not a
// deployment that did not answer.
var errWrongKind = errors.New("not the kind of server given")

// defaultDeadline bounds Run when its context has no deadline.
const defaultDeadline = 10 * time.Second

// Run audits the deployment cfg names and returns its findings, most
// severe first. It sends only reading commands, and probes (EVAL of a
// script that reads, WAIT 0 0). It returns an error matching
// fence.ErrInvalidOption for a bad Config, before anything is sent (or,
// for a plain redis-server given as every sentinel or cluster seed, once
// they have said so), and one
// matching ErrUnreachable when the deployment cannot be read; either way by
// ctx's deadline, or within 10 s if ctx has none. When ctx is cancelled
// first, it returns at once (its connections are closed, so that no read
// waits for its own timeout) an error matching context.Canceled, and not
// ErrUnreachable: the deployment was not found unreachable.
func Run(ctx context.Context, cfg Config) ([]Finding, error) {
	n := 0
	for _, set := range []bool{cfg.Standalone != nil, cfg.Sentinel != nil, cfg.Cluster != nil, cfg.Redlock != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, fmt.Errorf("%w: doctor: give one of Standalone, Sentinel, Cluster and Redlock", fence.ErrInvalidOption)
	}
	if cfg.Redlock != nil && (len(cfg.Redlock) == 0 || slices.Contains(cfg.Redlock, nil)) {
		return nil, fmt.Errorf("%w: doctor: Redlock needs at least one master, and no nil one", fence.ErrInvalidOption)
	}
	if cfg.LeaseTime < 0 || cfg.MaxSkew < 0 {
		return nil, fmt.Errorf("%w: doctor: negative lease time or skew", fence.ErrInvalidOption)
	}
	if cfg.Sentinel != nil && cfg.Sentinel.MasterName == "" {
		return nil, fmt.Errorf("%w: doctor: Sentinel needs MasterName", fence.ErrInvalidOption)
	}
	// Without an address a Cluster audited nothing and reported no
	// findings (TestNoAddresses).
	if cfg.Sentinel != nil && len(cfg.Sentinel.SentinelAddrs) == 0 || cfg.Cluster != nil && len(cfg.Cluster.Addrs) == 0 {
		return nil, fmt.Errorf("%w: doctor: Sentinel needs SentinelAddrs, Cluster needs Addrs", fence.ErrInvalidOption)
	}
	if cfg.Redlock != nil {
		cfg.Prefix = cmp.Or(cfg.Prefix, redlock.DefaultPrefix)
		cfg.LeaseTime = cmp.Or(cfg.LeaseTime, redlock.DefaultWatchdogTTL)
	}
	cfg.Prefix = cmp.Or(cfg.Prefix, redislock.DefaultPrefix)
	cfg.LeaseTime = cmp.Or(cfg.LeaseTime, redislock.DefaultWatchdogTTL)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultDeadline)
		defer cancel()
	}
	d := &deployment{cfg: cfg}
	defer d.close()
	// go-redis bounds a read by ctx's deadline but does not watch its
	// cancellation: a read from a silent node outlived a ^C by the
	// client's read timeout (TestDoctorInterrupted). Closing the clients
	// ends it.
	stop := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			d.close()
		}
	})
	defer stop()
	var err error
	switch {
	case cfg.Standalone != nil:
		err = d.readStandalone(ctx, *cfg.Standalone)
	case cfg.Sentinel != nil:
		err = d.readSentinel(ctx)
	case cfg.Redlock != nil:
		err = d.readRedlock(ctx)
	default:
		err = d.readCluster(ctx)
	}
	if errors.Is(err, errWrongKind) {
		return nil, fmt.Errorf("%w: doctor: %w", fence.ErrInvalidOption, err)
	}
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		return nil, fmt.Errorf("doctor: audit interrupted: %w", errors.Join(context.Cause(ctx), err))
	}
	if err != nil {
		// A node that hung is reported at the deadline by an i/o
		// timeout, which may come just before ctx says it is done.
		dl, _ := ctx.Deadline()
		if ctx.Err() != nil || !time.Now().Before(dl) {
			err = errors.Join(err, cmp.Or(ctx.Err(), context.DeadlineExceeded))
		}
		return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	var findings []Finding
	for _, c := range checks {
		for _, f := range c(d) {
			// Findings quote what servers said (announced addresses,
			// configuration, error replies), and are printed on a
			// terminal: its control sequences are shown escaped.
			f.ID, f.Node, f.Why, f.Fix = termtext.Escape(f.ID), termtext.Escape(f.Node), termtext.Escape(f.Why), termtext.Escape(f.Fix)
			findings = append(findings, f)
		}
	}
	slices.SortStableFunc(findings, func(a, b Finding) int { return cmp.Compare(b.Severity, a.Severity) })
	return findings, nil
}

// deployment is one snapshot of everything the checks look at.
type deployment struct {
	cfg       Config
	kind      string  // "standalone", "sentinel", "cluster" or "redlock"
	primaries []*node // the nodes fence writes to
	replicas  []*node // their replicas that could be reached
	// unreachable lists replicas a primary names that did not answer.
	unreachable []string
	// why holds, by address, why an unreachable node could not be read,
	// where that is known (a Redlock master refusing the credentials).
	why      map[string]error
	sentinel *sentinelView
	cluster  *clusterView

	mu      sync.Mutex
	closed  bool // by close: a client tracked after it is closed at once
	clients []interface{ Close() error }
}

// track records c, to be closed by close.
func (d *deployment) track(c interface{ Close() error }) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		_ = c.Close()
		return
	}
	d.clients = append(d.clients, c)
}

// close closes the clients, those tracked from now on too. It is called
// at the end of Run, and when Run's ctx is cancelled, perhaps while reads
// go on.
func (d *deployment) close() {
	d.mu.Lock()
	cs := d.clients
	d.clients, d.closed = nil, true
	d.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
}

// node is what the doctor read from one redis-server.
type node struct {
	addr      string
	client    *redis.Client
	info      map[string]string // INFO replication and server fields
	config    map[string]string // CONFIG GET of the settings checked; nil if refused
	configErr error
	// offset is the server's clock minus the local clock at the middle of
	// the TIME round trip, give or take uncertainty (half the round trip).
	offset, uncertainty time.Duration
	timeErr             error
	probes              map[string]error // command → the error probing it gave
	denied              map[string]string
	aclErr              error // ACL DRYRUN not allowed: permissions unchecked
	counts              *redislock.ReplicaCounts
	countsErr           error
	// syncErr is the refusal, by a Locker on the node's client with the
	// replica sync rule, of every try that needs a WAIT (its read timeout
	// leaves no room for one), if it refuses them.
	syncErr error
	// On a cluster: the replicas the node's own table lists, and those
	// of them flagged fail.
	clusterReplicas, clusterFailed int
}

// configNames are the settings the checks read.
var configNames = []string{
	"save", "appendonly", "appendfsync", "maxmemory", "maxmemory-policy",
	"min-replicas-to-write", "min-replicas-max-lag", "cluster-node-timeout",
	"replica-read-only", "no-appendfsync-on-rewrite",
}

// nodeOptions returns a copy of o for addr, bounded by ctx and without retries,
// so that a dead node costs one attempt.
func nodeOptions(o redis.Options, addr string) *redis.Options {
	o.Addr = addr
	o.ContextTimeoutEnabled = true
	o.MaxRetries = -1
	o.PoolSize = 2
	return &o
}

func (d *deployment) open(o redis.Options, addr string) *redis.Client {
	c := redis.NewClient(nodeOptions(o, addr))
	d.track(c)
	return c
}

// partOf bounds a read that must not take the whole of ctx's time (a
// replica or a sentinel that hangs must leave time for the rest) to a
// third of what is left.
func partOf(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, _ := ctx.Deadline() // Run gives ctx a deadline
	return context.WithTimeout(ctx, time.Until(dl)/3)
}

// tlsAnswer explains err, a connection to a TLS node reset or ended, by
// the node's answer to a handshake alone (see tlsanswer.Explain), within a
// third of what is left of ctx.
func tlsAnswer(ctx context.Context, o *redis.Options, err error) error {
	pctx, cancel := partOf(ctx)
	defer cancel()
	return tlsanswer.Explain(pctx, o.Addr, o.TLSConfig, err)
}

// readNode reads one node; an error means it did not answer at all.
func (d *deployment) readNode(ctx context.Context, c *redis.Client, primary bool) (*node, error) {
	n := &node{addr: c.Options().Addr, client: c}
	info, err := c.Info(ctx, "replication", "server").Result()
	if err != nil && !isReply(err) {
		return nil, fmt.Errorf("%s: INFO: %w", n.addr, tlsAnswer(ctx, c.Options(), err))
	}
	if isAuthError(err) {
		// Every command would be refused alike, and read as EVAL, CONFIG
		// and the rest disabled: the node could not be read at all.
		return nil, fmt.Errorf("%s: authentication refused: %w", n.addr, &authError{err})
	}
	n.info = parseInfo(info) // empty when INFO is refused: the probes report it
	n.config = map[string]string{}
	for _, name := range configNames {
		kv, err := c.ConfigGet(ctx, name).Result()
		if err != nil {
			n.config, n.configErr = nil, err
			break
		}
		maps.Copy(n.config, kv)
	}
	if d.kind != "redlock" { // readRedlock reads the clocks one after another
		n.readTime(ctx, d.cfg.Now)
	}
	if primary {
		n.probe(ctx, d.cfg.Prefix, d.kind == "redlock", d.cfg.ReplicaSync.Disabled)
	}
	// A refusal is a finding; no answer (a node that stopped answering
	// half way) is not, and must not read as one.
	for what, err := range n.errs() {
		if err != nil && !isReply(err) {
			return nil, fmt.Errorf("%s: %s: %w", n.addr, what, err)
		}
	}
	return n, nil
}

// errs returns what reading the node met, by what was read.
func (n *node) errs() map[string]error {
	m := map[string]error{"CONFIG GET": n.configErr, "TIME": n.timeErr, "ACL": n.aclErr}
	for cmd, err := range n.probes {
		m[cmd] = err
	}
	return m
}

// isReply reports whether err is the server's reply, rather than a
// failure to get one.
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// authError marks a node's refusal of the doctor's credentials.
type authError struct{ error }

func (e *authError) Unwrap() error { return e.error }

// isAuthError reports whether err is the server refusing the connection's
// credentials (a wrong password or user, or none given where one is needed).
func isAuthError(err error) bool {
	if !isReply(err) {
		return false
	}
	msg := err.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "ERR invalid password", "ERR invalid username-password"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// readTime measures the node's clock against the local one.
func (n *node) readTime(ctx context.Context, now func() time.Time) {
	t0 := now()
	t, err := n.client.Time(ctx).Result()
	t1 := now()
	if err != nil {
		n.timeErr = err
		return
	}
	mid := t0.Add(t1.Sub(t0) / 2)
	n.offset = t.Sub(mid)
	n.uncertainty = max(t1.Sub(t0)/2, 0)
}

// probe tries the commands fence sends, in forms that change nothing, and
// asks ACL DRYRUN about the ones that write. With noSync (replica sync
// off) the lockers send no WAIT and never run the replica record script
// that reads INFO: neither is probed (a user denied them locks fine).
func (n *node) probe(ctx context.Context, prefix string, redlock, noSync bool) {
	key := prefix + ":{doctor}"
	n.probes = map[string]error{}
	// The probes declare that they write nothing, as Status's scripts do,
	// so that a primary pausing writes (CLIENT PAUSE WRITE, a switchover)
	// runs them at once: it held back scripts without flags for the whole
	// pause, and the audit ended at its deadline (TestWritePause).
	s := redis.NewScript(probeScripts["EVAL"])
	n.probes["EVAL"] = s.Eval(ctx, n.client, []string{key}).Err()
	// Only once EVAL has cached the script: the EVALSHA of a script the
	// server does not know, whose flags it cannot read, is held back for
	// as long as writes are paused, and would only say NOSCRIPT anyway
	// (TestWritePauseUserWithoutEval). ACL DRYRUN still asks about it.
	if n.probes["EVAL"] == nil || isRedirect(n.probes["EVAL"]) {
		n.probes["EVALSHA"] = s.EvalSha(ctx, n.client, []string{key}).Err()
	}
	if redis.HasErrorPrefix(n.probes["EVALSHA"], "NOSCRIPT") {
		n.probes["EVALSHA"] = nil // the command exists; EVAL failed to load it
	}
	for _, cmd := range []string{"EVAL", "EVALSHA"} {
		if isRedirect(n.probes[cmd]) {
			// A cluster node that does not serve the probe's slot: the
			// command exists. ACL DRYRUN checks the key's permissions.
			n.probes[cmd] = nil
		}
	}
	if !redlock && !noSync {
		n.probes["WAIT"] = n.client.Do(ctx, "WAIT", 0, 0).Err()
		n.probes["INFO"] = redis.NewScript(probeScripts["INFO"]).Eval(ctx, n.client, nil).Err()
	}

	user, err := n.client.Do(ctx, "ACL", "WHOAMI").Text()
	if err != nil {
		n.aclErr = err
		return
	}
	n.denied = map[string]string{}
	cmds := aclCommands(prefix)
	if redlock {
		cmds = redlockCommands(prefix)
	} else if noSync {
		cmds = slices.DeleteFunc(cmds, func(args []any) bool { return args[0] == "WAIT" || args[0] == "INFO" })
	}
	for _, args := range cmds {
		reply, err := n.client.Do(ctx, append([]any{"ACL", "DRYRUN", user}, args...)...).Text()
		if err != nil {
			n.aclErr = err
			return
		}
		if reply != "OK" {
			n.denied[strings.ToUpper(args[0].(string))] = reply
		}
	}
}

// probeScripts are the scripts that probe EVAL (EVALSHA runs it again by
// its SHA) and INFO, one command a line, so that a command refused inside
// one is named by the line Redis reports ("@user_script:N"; see
// deniedCommand).
var probeScripts = map[string]string{
	"EVAL": "#!lua flags=no-writes\n" +
		"local exists = redis.call('EXISTS', KEYS[1])\n" +
		"local pttl = redis.call('PTTL', KEYS[1])\n" +
		"return {exists, pttl, redis.call('TIME')[1]}",
	"INFO": "#!lua flags=no-writes\nreturn redis.call('INFO', 'replication')",
}

// aclCommands are the commands fence sends, directly or from its scripts,
// with sample arguments on its keys and channels.
func aclCommands(prefix string) [][]any {
	key := prefix + ":{doctor}"
	ch := key + ":released"
	// The scripts are asked about with the release script's keys (the
	// acquire script's are among them): Redis checks a script's declared
	// keys before it runs it, and a user refused one of them (key patterns
	// written for the layout before P:{N}:released-by) cannot release.
	return append(evals("7", key, key+":token", key+":queue", key+":waiters", key+":waiting",
		key+":revoked:"+strings.Repeat("0", 32), key+":released-by"), [][]any{
		{"WAIT", "0", "0"},
		{"GET", key}, {"SET", key, "x", "PX", "1"}, {"SET", key, "x", "NX", "GET", "PX", "1"}, {"DEL", key},
		{"EXISTS", key}, {"PEXPIRE", key, "1"}, {"PTTL", key}, {"RENAME", key, key + ":released-by"},
		{"RPUSH", key, "x"}, {"LINDEX", key, "0"}, {"LPOP", key}, {"LLEN", key}, {"LRANGE", key, "0", "-1"},
		{"HSET", key, "x", "x"}, {"HGET", key, "x"}, {"HDEL", key, "x"}, {"HLEN", key},
		{"TIME"}, {"INFO", "replication"},
		{"PUBLISH", ch, "x"}, {"SUBSCRIBE", ch},
	}...)
}

// evals are the EVAL and EVALSHA commands with keys (their count first).
func evals(keys ...any) [][]any {
	return [][]any{
		append([]any{"EVAL", "return 1"}, keys...),
		append([]any{"EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"}, keys...),
	}
}

// redlockCommands are the commands redlock sends, directly or from its
// scripts: no WAIT, INFO, pub/sub, queue of waiters or released-by record
// (its scripts are asked about with the lock's key).
func redlockCommands(prefix string) [][]any {
	return append(evals("1", prefix+":{doctor}"), slices.DeleteFunc(aclCommands(prefix), func(args []any) bool {
		return slices.Contains([]string{"EVAL", "EVALSHA", "WAIT", "INFO", "PUBLISH", "SUBSCRIBE", "RPUSH", "LINDEX", "LPOP", "LLEN", "LRANGE", "HSET", "HGET", "HDEL", "HLEN", "RENAME"}, args[0].(string))
	})...)
}

// isRedirect reports whether err is a cluster's answer about slots rather
// than about the command.
func isRedirect(err error) bool {
	for _, p := range []string{"MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

func parseInfo(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m
}

// replicaLine is one slaveN line of a primary's INFO replication.
type replicaLine struct {
	addr  string
	state string
	lag   int
}

func (n *node) replicaLines() []replicaLine {
	var out []replicaLine
	for i := 0; ; i++ {
		v, ok := n.info["slave"+strconv.Itoa(i)]
		if !ok {
			return out
		}
		f := map[string]string{}
		for _, kv := range strings.Split(v, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				f[k] = v
			}
		}
		lag, _ := strconv.Atoi(f["lag"])
		out = append(out, replicaLine{addr: f["ip"] + ":" + f["port"], state: f["state"], lag: lag})
	}
}

func (n *node) connected() int { c, _ := strconv.Atoi(n.info["connected_slaves"]); return c }

// readPrimary reads a primary, its replica counts and its replicas.
func (d *deployment) readPrimary(ctx context.Context, o redis.Options, c *redis.Client) error {
	p, err := d.readNode(ctx, c, true)
	if err != nil {
		return err
	}
	d.primaries = append(d.primaries, p)
	if d.kind != "cluster" && p.info["role"] == "master" {
		l, err := redislock.New(c, &redislock.Options{Prefix: d.cfg.Prefix, ReplicaSync: d.cfg.ReplicaSync})
		if err != nil {
			return err
		}
		// A read_timeout no WAIT fits in: a finding once the primary has
		// replicas (checkReplicaCounts). It said "deployment unreachable"
		// and audited nothing when New refused such a client
		// (TestDoctorShortReadTimeout).
		p.syncErr = l.ReplicaSyncRefusal()
		r, err := l.ReplicaCounts(ctx, "doctor")
		p.counts, p.countsErr = &r, err
		if err != nil {
			p.counts = nil
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, rl := range p.replicaLines() {
		wg.Go(func() {
			ctx, cancel := partOf(ctx)
			defer cancel()
			c := redis.NewClient(nodeOptions(o, rl.addr))
			d.track(c)
			r, err := d.readNode(ctx, c, false)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				_ = c.Close()
				d.unreachable = append(d.unreachable, rl.addr)
				if d.why == nil {
					d.why = map[string]error{}
				}
				d.why[rl.addr] = err // a refused password is said as such
				return
			}
			d.replicas = append(d.replicas, r)
		})
	}
	wg.Wait()
	return nil
}

// readRedlock reads each master as a standalone primary, at once, each
// within a third of the time left: a master that does not answer is a
// finding (Redlock goes on with a majority), all of them silent an error.
func (d *deployment) readRedlock(ctx context.Context) error {
	d.kind = "redlock"
	nodes := make([]*node, len(d.cfg.Redlock))
	errs := make([]error, len(d.cfg.Redlock))
	var wg sync.WaitGroup
	for i, o := range d.cfg.Redlock {
		c := d.open(*o, o.Addr)
		wg.Go(func() {
			ctx, cancel := partOf(ctx)
			defer cancel()
			nodes[i], errs[i] = d.readNode(ctx, c, true)
		})
	}
	wg.Wait()
	for i, n := range nodes {
		if n == nil {
			d.unreachable = append(d.unreachable, d.cfg.Redlock[i].Addr)
			if d.why == nil {
				d.why = map[string]error{}
			}
			d.why[d.cfg.Redlock[i].Addr] = errs[i]
			continue
		}
		d.primaries = append(d.primaries, n)
	}
	// The clocks in the order given, each TIME a short round trip: a
	// master that stopped answering meanwhile is left out of the skew.
	for _, n := range d.primaries {
		tctx, cancel := partOf(ctx)
		n.readTime(tctx, d.cfg.Now)
		cancel()
	}
	if len(d.primaries) == 0 {
		return fmt.Errorf("no Redlock master answered: %w", errors.Join(errs...))
	}
	return nil
}

func (d *deployment) readStandalone(ctx context.Context, o redis.Options) error {
	d.kind = "standalone"
	return d.readPrimary(ctx, o, d.open(o, o.Addr))
}

// sentinelView is what the sentinels said about the monitored master.
type sentinelView struct {
	master      string
	addrs       []string // the sentinels configured
	unreachable []string // those that did not answer
	// tlsFailed holds, by address, the TLS handshake failure of an
	// unreachable sentinel whose answer was one (see tlsanswer.Refusal).
	tlsFailed map[string]error
	known     int // sentinels the first one that answered knows, itself included
	quorum    int
	downAfter time.Duration
	ckquorum  error // SENTINEL CKQUORUM's refusal, if any
	from      string
	// downReplicas are the replicas the sentinels list as down or
	// disconnected; the primary no longer lists them.
	downReplicas []sentinelReplica
	// named maps each primary address the answering sentinels give for
	// the master to the sentinels that give it: more than one is a
	// split, whose clients lock on different primaries.
	named map[string][]string
}

type sentinelReplica struct{ addr, flags, link string }

func (d *deployment) readSentinel(ctx context.Context) error {
	d.kind = "sentinel"
	fo := d.cfg.Sentinel
	sv := &sentinelView{master: fo.MasterName, addrs: fo.SentinelAddrs}
	d.sentinel = sv
	var master []string
	var errs []error // why each sentinel gave no master
	plain := 0       // sentinels that answered as a plain redis-server
	for _, addr := range fo.SentinelAddrs {
		sc := redis.NewSentinelClient(nodeOptions(redis.Options{
			Username: fo.SentinelUsername, Password: fo.SentinelPassword, TLSConfig: fo.TLSConfig,
		}, addr))
		d.track(sc)
		sctx, cancel := partOf(ctx)
		m, err := sc.Master(sctx, fo.MasterName).Result()
		cancel()
		if err != nil {
			if isReply(err) && strings.Contains(err.Error(), "unknown command 'sentinel'") {
				plain++
			}
			sv.unreachable = append(sv.unreachable, addr)
			err = tlsAnswer(ctx, &redis.Options{Addr: addr, TLSConfig: fo.TLSConfig}, err)
			if tlsErr := tlsanswer.Refusal(err); tlsErr != nil {
				if sv.tlsFailed == nil {
					sv.tlsFailed = map[string]error{}
				}
				sv.tlsFailed[addr] = tlsErr
			}
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		if master != nil {
			// Every sentinel is asked which primary it names: a
			// client goes to the first that answers, so sentinels
			// that disagree send clients to two primaries.
			sctx, cancel := partOf(ctx)
			a, err := sc.GetMasterAddrByName(sctx, fo.MasterName).Result()
			cancel()
			if err == nil && len(a) == 2 {
				p := net.JoinHostPort(a[0], a[1])
				sv.named[p] = append(sv.named[p], addr)
			}
			continue
		}
		a, err := sc.GetMasterAddrByName(ctx, fo.MasterName).Result()
		if err != nil || len(a) != 2 {
			return fmt.Errorf("sentinel %s: master %q: %v %w", addr, fo.MasterName, a, err)
		}
		master, sv.from = a, addr
		sv.named = map[string][]string{net.JoinHostPort(a[0], a[1]): {addr}}
		others, _ := strconv.Atoi(m["num-other-sentinels"])
		sv.known = others + 1
		sv.quorum, _ = strconv.Atoi(m["quorum"])
		ms, _ := strconv.Atoi(m["down-after-milliseconds"])
		sv.downAfter = time.Duration(ms) * time.Millisecond
		sv.ckquorum = sc.CkQuorum(ctx, fo.MasterName).Err()
		replicas, err := sc.Replicas(ctx, fo.MasterName).Result()
		if err != nil {
			return fmt.Errorf("sentinel %s: replicas of %q: %w", addr, fo.MasterName, err)
		}
		for _, r := range replicas {
			flags := strings.Split(r["flags"], ",")
			if slices.Contains(flags, "s_down") || slices.Contains(flags, "disconnected") || r["master-link-status"] != "ok" {
				sv.downReplicas = append(sv.downReplicas, sentinelReplica{
					addr: net.JoinHostPort(r["ip"], r["port"]), flags: r["flags"], link: r["master-link-status"]})
			}
		}
	}
	if master == nil && plain == len(fo.SentinelAddrs) {
		return fmt.Errorf("%w: %v is not a sentinel (%w): give the sentinels' addresses, or audit a redis-server itself with --redis (Config.Standalone)", errWrongKind, fo.SentinelAddrs, errors.Join(errs...))
	}
	if master == nil {
		// Say why: "No such master with that name" is a wrong
		// master_name, not a network problem.
		return fmt.Errorf("no sentinel of %v answered for master %q: %w", fo.SentinelAddrs, fo.MasterName, errors.Join(errs...))
	}
	o := redis.Options{Username: fo.Username, Password: fo.Password, DB: fo.DB, TLSConfig: fo.TLSConfig}
	return d.readPrimary(ctx, o, d.open(o, net.JoinHostPort(master[0], master[1])))
}

// clusterView is what the cluster said about itself.
type clusterView struct {
	slotsOK int    // cluster_slots_ok of the node that answered first
	state   string // its cluster_state
}

func (d *deployment) readCluster(ctx context.Context) error {
	d.kind = "cluster"
	co := d.cfg.Cluster
	o := redis.Options{Username: co.Username, Password: co.Password, TLSConfig: co.TLSConfig}
	var info, nodes string
	var errs []error
	plain := 0 // seeds that answered as a redis-server without cluster support
	for _, addr := range co.Addrs {
		c := d.open(o, addr)
		// A seed that hangs takes a third of the time left, so that the
		// next seeds are still asked.
		sctx, cancel := partOf(ctx)
		var err error
		if info, err = c.ClusterInfo(sctx).Result(); err == nil {
			nodes, err = c.ClusterNodes(sctx).Result()
		}
		cancel()
		if err == nil {
			break
		}
		if !isReply(err) {
			d.unreachable = append(d.unreachable, addr) // a finding if another seed answers
		} else if strings.Contains(err.Error(), "cluster support disabled") {
			plain++
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		info = ""
	}
	if info == "" && plain == len(co.Addrs) {
		return fmt.Errorf("%w: %v is not a cluster node (%w): audit a standalone redis-server with --redis (Config.Standalone)", errWrongKind, co.Addrs, errors.Join(errs...))
	}
	if info == "" {
		return errors.Join(errs...)
	}
	ci := parseInfo(info)
	d.cluster = &clusterView{state: ci["cluster_state"]}
	d.cluster.slotsOK, _ = strconv.Atoi(ci["cluster_slots_ok"])
	// One node's table may lag behind the others' (a replica that just
	// joined still listed as a master): each master is asked itself
	// about its role and its replicas, as redislock does.
	for _, addr := range clusterMasters(nodes) {
		c := d.open(o, addr)
		// A master that hangs takes a third of the time left, so that
		// the masters after it are still audited. (With all of ctx, a
		// paused master listed first left the others "unreachable",
		// their own findings unread.)
		mctx, cancel := partOf(ctx)
		err := d.readPrimary(mctx, o, c)
		if err != nil {
			cancel()
			// A master that does not answer is a finding, not the end:
			// the others can still be audited.
			if !slices.Contains(d.unreachable, addr) { // a seed too
				d.unreachable = append(d.unreachable, addr)
			}
			continue
		}
		p := d.primaries[len(d.primaries)-1]
		if p.info["role"] == "slave" {
			cancel()
			d.primaries = d.primaries[:len(d.primaries)-1] // its master lists it
			continue
		}
		own, err := c.ClusterNodes(mctx).Result()
		cancel()
		if err != nil && !isReply(err) {
			return fmt.Errorf("%s: CLUSTER NODES: %w", addr, err)
		}
		p.clusterReplicas, p.clusterFailed = ownReplicas(own)
	}
	if len(d.primaries) == 0 {
		return fmt.Errorf("no master of the cluster answered: %v", d.unreachable)
	}
	return nil
}

// clusterLine is one line of CLUSTER NODES.
type clusterLine struct {
	id, addr, master string
	flags            []string
}

func parseClusterNodes(s string) []clusterLine {
	var out []clusterLine
	for _, l := range strings.Split(s, "\n") {
		f := strings.Fields(l)
		if len(f) < 4 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		out = append(out, clusterLine{id: f[0], addr: addr, flags: strings.Split(f[2], ","), master: f[3]})
	}
	return out
}

// clusterMasters returns the addresses of the masters CLUSTER NODES lists.
func clusterMasters(nodes string) []string {
	var out []string
	for _, l := range parseClusterNodes(nodes) {
		if slices.Contains(l.flags, "master") {
			out = append(out, l.addr)
		}
	}
	return out
}

// ownReplicas counts the replicas of the node marked myself in its CLUSTER
// NODES, and those of them flagged fail.
func ownReplicas(nodes string) (replicas, failed int) {
	lines := parseClusterNodes(nodes)
	var me string
	for _, l := range lines {
		if slices.Contains(l.flags, "myself") {
			me = l.id
		}
	}
	for _, l := range lines {
		if me != "" && l.master == me {
			replicas++
			if slices.Contains(l.flags, "fail") {
				failed++
			}
		}
	}
	return replicas, failed
}
