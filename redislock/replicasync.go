package redislock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/fencekit/fence/internal/pause"
	"github.com/fencekit/fence/internal/rediscluster"
	"github.com/fencekit/fence/internal/redisconn"
	"github.com/redis/go-redis/v9"
)

// Acknowledgement rules for ReplicaSync.Acks besides a plain number.
const (
	AcksMajority = -1 // more than half of the expected replicas
	AcksAll      = -2 // every expected replica
)

// ReplicaSync configures replica-synced acquisition: after the acquire
// script, WAIT (pipelined on the same connection, since WAIT only counts
// its own connection's writes) confirms that enough replicas have the lock.
// If they do not within Timeout, the lock is released and Acquire returns an
// error matching fence.ErrNotReplicated. With a wait budget it first tries
// again, with back-off, until the budget ends; a waiter whose refused try
// found the lock its own already (granted to it from the queue, or taken by
// a try of its own sent without WAIT) keeps its place in line meanwhile: it
// keeps the lock, which nobody uses (its expiry brought down to what is
// left of the budget), and its next try confirms it again;
// the lock is released, to the next in line, when the budget ends first.
// Renewals are confirmed the same way;
// an unconfirmed renewal does not move the lease's deadline.
//
// On a *redis.Ring the script, its WAIT and the replica record go to the
// shard that holds the lock (the Ring's own client would send the
// key-less WAIT, and the record's key, to other shards), and each shard
// keeps its own record.
//
// On a client of a type redislock cannot identify (see
// HiddenClusterError), whose key-less WAIT could go anywhere if it hid a
// cluster client or a Ring, the first synced call asks, in one round trip
// (again every 10 s while the answer is one server: a hidden Ring may get
// more shards), whether the server is a Redis Cluster node (INFO
// cluster) and which servers 32 keys with random hash tags reach (a
// read-only script returning run_id); a cluster node, or more than one
// server, refuses every acquisition with a *HiddenClusterError, before
// anything is written. A client of one server goes on as a *redis.Client.
// When the server refuses INFO (NOPERM: an ACL user with +@all
// -@dangerous, which sets Replicas), the question is asked again without
// it: HELLO's mode (cluster, or standalone) in place of cluster_enabled,
// and in place of run_id a mark, P:{probe:<random>}:mark, expiring in a
// minute, that the first of the scripts run on each server sets there; an
// answer neither tells (HELLO refused too, another mode) refuses the
// acquisition with that error.
//
// It fails closed: a replica that was seen and is gone (link cut, process
// stopped) is still waited for, by every Locker of that primary, so its
// acquisitions are refused rather than confirmed by nobody. A Locker reads
// the counts (one round trip: a script that reads INFO replication and the
// record; on a cluster INFO replication and CLUSTER NODES) on its first
// acquisition on a primary and then every 10 s, and sooner (at most once a
// second) when a WAIT sees more replicas than expected or fewer than
// required. The record has no expiry:
// volatile-* eviction policies never remove it, but under an allkeys-*
// policy an eviction restarts the count from the replicas connected then.
// A record fence did not write refuses acquisitions with a
// ReplicaRecordError naming the key until it is deleted or set.
//
// It is on by default and costs nothing on a primary without replicas. Turn
// it off (Disabled) only where a lost lock is harmless because the resource
// checks tokens anyway, or where the primary has no replicas that could be
// promoted.
//
// WAIT is not consensus. It narrows the window in which a failover loses a
// lock, but a promoted replica may be one that did not acknowledge (with
// Acks 1 and two replicas, the other one), and a holder that pauses is not
// stopped by it. Fencing tokens checked by the resource cover both.
type ReplicaSync struct {
	// Disabled turns the check off.
	Disabled bool

	// Acks is how many replicas must acknowledge: a number, AcksMajority or
	// AcksAll. Zero means 1, Redisson's rule. A number above Replicas, when
	// Replicas is set, is refused by New: no acquisition could be confirmed.
	Acks int

	// Replicas is how many replicas the primary is expected to have. Zero
	// means discover, from a record kept on the primary itself so that every
	// client of it, in every process, expects the replicas any of them has
	// seen connected: the key Prefix+":replicas" holds the primary's
	// replication id (master_replid) and the largest connected_slaves seen
	// under it. A replica that disconnects keeps counting, for fresh and old
	// Lockers alike, until an operator lowers the record with
	// Locker.SetExpectedReplicas (when the replica is decommissioned) or a
	// failover gives the primary a new replication id. On a cluster the
	// expected count of a master is the number of replicas the cluster's
	// node table lists for it (failed ones included) or the connected count
	// if larger; CLUSTER FORGET lowers it. A replica that no client ever
	// saw connected (cut off before any Locker read the counts, or before
	// the cluster's gossip listed it) is not expected: set Replicas where
	// that matters. Set Replicas to override both.
	Replicas int

	// Timeout bounds each WAIT. Default 1 s (Redisson's slavesSyncTimeout),
	// or less on a go-redis client whose ReadTimeout is under 2.1 s: half
	// of what is left of it after 100 ms. WAIT's reply is read within the
	// client's read timeout, and Redis sends it up to 100 ms (a clock
	// tick) after Timeout, so a longer Timeout would end in the client's
	// i/o timeout: New refuses one with fence.ErrInvalidOption unless
	// Timeout + 100 ms < ReadTimeout. The 100 ms is Redis's default clock
	// (hz 10); a server run with a lower hz (down to 1: a second a tick)
	// may answer later than the client reads. When the client gives up
	// on WAIT's reply (its read timeout, or the context's deadline on a
	// client that puts it on the socket) after it read the script's,
	// nothing confirmed the script's write: a lock it took is released as
	// after too few acknowledgements, and the error matches
	// ErrNotReplicated (Acked 0) and wraps the client's; a renewal is
	// refused likewise, and a Release that sent WAIT for a handoff
	// reports what its script did. go-redis closes the connection whose
	// read timed out; the release goes on another. When the script's
	// reply was not read either, or
	// the Locker stopped waiting for the call at the context's end (see
	// the package doc on deadlines), whether it ran is unknown: the
	// error is the client's or the context's, and the lock is given back
	// or revoked in the background. On a
	// client whose ReadTimeout is 101 ms or less no timeout fits: every try
	// that needs a WAIT is refused with fence.ErrInvalidOption before it
	// runs (Locker.ReplicaSyncRefusal), and on a primary without replicas
	// none does. A cluster's node clients or
	// a Ring's shard clients made by a NewClient of the caller's with a
	// ReadTimeout of their own get the same default, for their WAITs, when
	// Timeout does not fit in it.
	Timeout time.Duration

	_ struct{}
}

// replicaReadEvery is how long a Locker trusts its cached replica counts
// before reading them from the primary again. A WAIT that sees more replicas
// than expected, or fewer than required, reads them again at once.
const replicaReadEvery = 10 * time.Second

// replicaCounts caches the replica counts of each primary. The truth is on
// the server (the record, or the cluster's node table); the cache only saves
// a round trip per acquisition.
type replicaCounts struct {
	now func() time.Time // time.Now; tests move it

	mu    sync.Mutex
	nodes map[string]*nodeReplicas // by node address; "" for a non-cluster client
}

type nodeReplicas struct {
	ReplicaCounts
	readAt time.Time
	stale  bool // a WAIT saw more replicas than expected
}

// ReplicaCounts are the replica counts of one primary.
type ReplicaCounts struct {
	// Expected is how many replicas the primary should have: the count
	// recorded on the primary, on a cluster the count its node table
	// lists (see ReplicaSync.Replicas), or ReplicaSync.Replicas if set.
	Expected int
	// Connected is connected_slaves from INFO replication.
	Connected int
	// ReplicationID is the primary's master_replid; a failover changes it.
	ReplicationID string
}

// ReplicaRecordError reports a replica record on the server that fence
// did not write: acquisitions on that primary fail (closed) until an
// operator deletes it or sets it with Locker.SetExpectedReplicas.
type ReplicaRecordError struct {
	Key    string // the record's key
	Detail string // the server's description
}

// Error describes the failure with its figures.
func (e *ReplicaRecordError) Error() string {
	return fmt.Sprintf("bad replica record %s: %s", e.Key, e.Detail)
}

const replicaRecordErrPrefix = "FENCEREPLICAS "

// expected returns how many replicas node should have, reading them through
// c when the cached figure is old or marked stale. force reads them unless
// they were read within the last second.
func (l *Locker) expected(ctx context.Context, node string, c redis.Cmdable, force bool) (int, error) {
	rc := &l.replicas
	now := rc.now()
	rc.mu.Lock()
	nr := rc.nodes[node]
	if nr != nil && !nr.stale && now.Sub(nr.readAt) < replicaReadEvery && (!force || now.Sub(nr.readAt) < time.Second) {
		n := nr.Expected
		rc.mu.Unlock()
		return n, nil
	}
	rc.mu.Unlock()

	r, err := l.readReplicas(ctx, c, "raise")
	if err != nil {
		if l.sharded && errors.Is(err, fence.ErrInvalidOption) {
			l.notCluster.Store(&err) // servers not in cluster mode: kept
		}
		return 0, err
	}
	l.cacheReplicas(node, r, now)
	return r.Expected, nil
}

func (l *Locker) cacheReplicas(node string, r ReplicaCounts, at time.Time) {
	rc := &l.replicas
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.nodes[node] = &nodeReplicas{ReplicaCounts: r, readAt: at}
}

func (l *Locker) markStale(node string) {
	rc := &l.replicas
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if nr := rc.nodes[node]; nr != nil {
		nr.stale = true
	}
}

// readReplicas reads the replica counts of the primary behind c in one
// round trip. mode is the record script's: "raise", "read" or "set" (then
// with the count in set).
func (l *Locker) readReplicas(ctx context.Context, c redis.Cmdable, mode string, set ...any) (ReplicaCounts, error) {
	if l.sharded {
		return clusterReplicas(ctx, c)
	}
	key := l.prefix + ":replicas"
	script := replicasScript
	if mode == "read" {
		script = replicasReadScript
	}
	res, err := l.run(ctx, c, script, skeys{names: []string{key}}, append([]any{mode}, set...)...).Slice()
	if err != nil {
		if msg, ok := strings.CutPrefix(err.Error(), replicaRecordErrPrefix+key+" "); ok {
			return ReplicaCounts{}, &ReplicaRecordError{Key: key, Detail: msg}
		}
		return ReplicaCounts{}, fmt.Errorf("redislock: read replica record %s: %w", key, err)
	}
	var r ReplicaCounts
	if len(res) == 3 {
		e, ok1 := res[0].(int64)
		n, ok2 := res[1].(int64)
		id, ok3 := res[2].(string)
		if ok1 && ok2 && ok3 {
			return ReplicaCounts{Expected: int(e), Connected: int(n), ReplicationID: id}, nil
		}
	}
	return r, fmt.Errorf("redislock: read replica record %s: unexpected reply %v", key, res)
}

// clusterReplicas reads a cluster master's replica counts: the connected
// ones from INFO replication, the expected ones from the cluster's node
// table, which lists a master's replicas (failed ones included) until
// CLUSTER FORGET removes them.
func clusterReplicas(ctx context.Context, c redis.Cmdable) (ReplicaCounts, error) {
	pipe := c.Pipeline()
	info := pipe.Info(ctx, "replication")
	nodes := pipe.ClusterNodes(ctx)
	if _, err := pipe.Exec(ctx); err != nil {
		if strings.Contains(err.Error(), "cluster support disabled") {
			// A ClusterClient over servers not in cluster mode: one of
			// redis.NewFailoverClusterClient (Sentinel's primary and
			// replicas as a one-slot-range cluster), which may send a
			// key-less WAIT to a replica.
			return ReplicaCounts{}, fmt.Errorf("%w: redislock: the *redis.ClusterClient's servers are not in cluster mode (a client of redis.NewFailoverClusterClient?): replica sync needs the primary's own connection; pass redis.NewFailoverClient's client to the Locker, or disable replica sync: %w", fence.ErrInvalidOption, err)
		}
		return ReplicaCounts{}, fmt.Errorf("redislock: read replica counts: %w", err)
	}
	var r ReplicaCounts
	r.Connected, r.ReplicationID = parseReplication(info.Val())
	r.Expected = max(r.Connected, knownReplicas(nodes.Val()))
	return r, nil
}

// knownReplicas counts the replicas of the node marked myself in the
// output of CLUSTER NODES.
func knownReplicas(nodes string) int {
	var me string
	var lines [][]string
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		lines = append(lines, f)
		if slices.Contains(strings.Split(f[2], ","), "myself") {
			me = f[0]
		}
	}
	n := 0
	for _, f := range lines {
		if me != "" && f[3] == me {
			n++
		}
	}
	return n
}

// parseReplication reads connected_slaves and master_replid from INFO
// replication.
func parseReplication(info string) (replicas int, replid string) {
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "connected_slaves":
			replicas, _ = strconv.Atoi(v)
		case "master_replid":
			replid = v
		}
	}
	return replicas, replid
}

// ReplicaCounts reads the replica counts of the primary that serves the lock
// called name (on a cluster, the master of its slot; on a Ring, the shard
// the Ring puts the name's keys on now; otherwise the one primary). It changes nothing on the server. Expected is
// ReplicaSync.Replicas when that is set. With replica sync on, a Locker
// whose client hides a cluster returns the *HiddenClusterError (see
// ReplicaSync).
func (l *Locker) ReplicaCounts(ctx context.Context, name string) (ReplicaCounts, error) {
	if ctx == nil {
		return ReplicaCounts{}, nilctx.Err("redislock", "ReplicaCounts")
	}
	if err := l.made(); err != nil {
		return ReplicaCounts{}, err
	}
	if err := fence.ValidateName(name); err != nil {
		return ReplicaCounts{}, err
	}
	r, err := bounded(ctx, &l.calls, func(ctx context.Context) (ReplicaCounts, error) {
		if err := l.hiddenClusterSynced(ctx); err != nil {
			return ReplicaCounts{}, fmt.Errorf("redislock: replicas of %q: %w", name, err)
		}
		_, c, err := l.primaryFor(ctx, l.keys(name).lock)
		if err != nil {
			return ReplicaCounts{}, fmt.Errorf("redislock: replicas of %q: %w", name, err)
		}
		return l.readReplicas(ctx, c, "read")
	}, nil)
	if err == nil && l.sync.Replicas > 0 {
		r.Expected = l.sync.Replicas
	}
	return r, err
}

// SetExpectedReplicas replaces the expected replica count recorded on the
// primary that serves the lock called name (on a Ring, the record of the
// name's shard); on a standalone, Sentinel or Ring deployment that is the
// count every Locker of that primary uses. Call it
// when a replica is decommissioned: the record is otherwise never lowered
// while the primary keeps its replication id. The record is raised again as
// soon as more replicas than n are connected. Other processes notice within
// 10 s, this Locker at once. On a cluster it returns an error matching
// fence.ErrInvalidOption: there the cluster's node table is the record, and
// CLUSTER FORGET removes a replica from it.
func (l *Locker) SetExpectedReplicas(ctx context.Context, name string, n int) error {
	if ctx == nil {
		return nilctx.Err("redislock", "SetExpectedReplicas")
	}
	if err := l.made(); err != nil {
		return err
	}
	if err := fence.ValidateName(name); err != nil {
		return err
	}
	if l.sharded {
		return fmt.Errorf("%w: redislock: on a cluster the node table holds the expected replicas; use CLUSTER FORGET", fence.ErrInvalidOption)
	}
	if n < 0 || n > 999999 {
		return fmt.Errorf("%w: redislock: expected replicas %d out of range", fence.ErrInvalidOption, n)
	}
	// A call given up on may still run: the record is then set, as asked,
	// a moment later; this Locker reads it again within 10 s.
	_, err := bounded(ctx, &l.calls, func(ctx context.Context) (struct{}, error) {
		if err := l.hiddenClusterSynced(ctx); err != nil {
			return struct{}{}, fmt.Errorf("redislock: set expected replicas: %w", err)
		}
		node, c, err := l.primaryFor(ctx, l.keys(name).lock)
		if err != nil {
			return struct{}{}, fmt.Errorf("redislock: set expected replicas: %w", err)
		}
		r, err := l.readReplicas(ctx, c, "set", n)
		if err == nil {
			l.cacheReplicas(node, r, l.replicas.now())
		}
		return struct{}{}, err
	}, nil)
	return err
}

// Required applies the acknowledgement rule to an expected replica count:
// how many replicas must acknowledge an acquisition or renewal. Zero means
// no WAIT is sent (sync disabled, or no replica expected).
func (s ReplicaSync) Required(expected int) int {
	if s.Disabled || expected == 0 {
		return 0
	}
	switch s.Acks {
	case 0:
		return 1
	case AcksMajority:
		return expected/2 + 1
	case AcksAll:
		return expected
	default:
		return s.Acks
	}
}

// evalSyncedOr runs script on the primary that owns key and, when replica
// sync applies there, WAIT on the same connection in the same round trip.
// It returns the script's reply, and how many replicas acknowledged and
// were required (both zero when no sync applied). On a cluster it follows
// MOVED and ASK redirections and retries TRYAGAIN (see onSlotMaster).
//
// With noWait it sends no WAIT but still returns how many acknowledgements
// sync would require (acked zero): the caller must not rely on the
// script's writes until a later synced call on the same keys has covered
// them (see Locker.try).
func (l *Locker) evalSyncedOr(ctx context.Context, noWait bool, script *redis.Script, keys skeys, args ...any) (reply *redis.Cmd, acked, required int, err error) {
	if l.sync.Disabled {
		return l.evalRouted(ctx, script, keys, args...)
	}
	if e := l.notCluster.Load(); e != nil {
		return nil, 0, 0, *e // as the try that found it: nothing sent
	}
	if err := l.hiddenCluster(ctx); err != nil {
		if _, hidden := err.(*HiddenClusterError); hidden && script == releaseScript {
			// A release goes without WAIT, and says that none covered
			// it (required 1, acked 0): no waiter takes a grant of it
			// unconfirmed, and the confirmation is refused.
			reply, _, _, err = l.evalRouted(ctx, script, keys, args...)
			return reply, 0, 1, err
		}
		return nil, 0, 0, err // before the script: nothing taken
	}
	var expected int
	node, last := "", redis.Cmdable(l.client)
	if !l.sharded {
		for try := 1; ; try++ {
			if l.conn == nil {
				// A Ring's shard; any other client is its own primary.
				if node, last, err = l.primaryFor(ctx, keys.names[0]); err != nil {
					return nil, 0, 0, err
				}
			}
			reply, acked, required, expected, err = l.evalOnce(ctx, node, last, false, noWait, script, keys, args)
			if !l.shardReplaced(try, keys.names[0], err) {
				break
			}
		}
	} else {
		err = l.onSlotMaster(ctx, keys.names[0], func(addr string, c redis.Cmdable, asking bool) error {
			node, last = addr, c
			var err error
			reply, acked, required, expected, err = l.evalOnce(ctx, node, c, asking, noWait, script, keys, args)
			return err
		})
	}
	if err != nil {
		return reply, 0, required, err
	}
	if noWait {
		return reply, 0, required, nil
	}
	if acked > expected {
		l.markStale(node)
	}
	if acked < required && l.sync.Replicas == 0 {
		// The topology may have changed (a failover gives a new
		// replication id, and with it a new record): read it again now,
		// for the next attempt. This one stays refused: its write may
		// have gone to a primary that is no longer the one read now.
		_, _ = l.expected(ctx, node, last, true)
	}
	return reply, acked, required, nil
}

// evalOnce runs script on c, the primary called node, with WAIT for as
// many acknowledgements as its expected replicas require (unless noWait:
// then without WAIT, acked zero).
func (l *Locker) evalOnce(ctx context.Context, node string, c redis.Cmdable, asking, noWait bool, script *redis.Script, keys skeys, args []any) (reply *redis.Cmd, acked, required, expected int, err error) {
	expected = l.sync.Replicas
	if expected == 0 {
		if expected, err = l.expected(ctx, node, c, false); err != nil {
			return nil, 0, 0, 0, err
		}
	}
	required = l.sync.Required(expected)
	waitFor := required
	if noWait || waitFor > 0 && l.syncUnfit != nil && script == releaseScript {
		waitFor = 0 // a release with no room for WAIT goes without
	}
	if waitFor > 0 && l.syncUnfit != nil {
		return nil, 0, required, expected, l.syncUnfit // before the script: nothing taken
	}
	if l.conn != nil {
		reply, acked, err = l.evalConn(ctx, script, keys.names, args, waitFor, l.sync.Timeout)
		return reply, acked, required, expected, err
	}
	reply, acked, err = l.evalPipelined(ctx, c, asking, waitFor, script, keys, args)
	return reply, acked, required, expected, err
}

// evalRouted runs script on the primary that owns keys[0], without WAIT,
// following cluster redirections as evalSyncedOr does.
func (l *Locker) evalRouted(ctx context.Context, script *redis.Script, keys skeys, args ...any) (reply *redis.Cmd, acked, required int, err error) {
	if !l.sharded {
		for try := 1; ; try++ {
			reply = l.run(ctx, l.client, script, keys, args...)
			if !l.shardReplaced(try, keys.names[0], reply.Err()) {
				return reply, 0, 0, reply.Err()
			}
		}
	}
	err = l.onSlotMaster(ctx, keys.names[0], func(_ string, c redis.Cmdable, asking bool) error {
		var err error
		reply, _, err = l.evalPipelined(ctx, c, asking, 0, script, keys, args)
		return err
	})
	return reply, 0, 0, err
}

// evalPipelined sends script (by SHA, again in full on NOSCRIPT) on c,
// preceded by ASKING when asking and followed by WAIT required timeout when
// required > 0, all in one pipeline: one connection, one round trip.
//
// On the Locker's own client the pipeline is one of l.pipes, reused, and
// the WAIT command's arguments are built once (see waitArgs): the uncontended
// acquisition pays for the two commands and their replies, not for a new
// pipeline each time. There, too, a call (without ASKING) that finds another
// call of the Locker in flight goes in the next batch instead (batch.go),
// but for a script sent in full (Status's reads), which must answer while
// the server holds writes back: the next batch waits for the batches in
// flight, whose writes a write pause holds (TestStatusDuringWritePauseBehindBatches).
func (l *Locker) evalPipelined(ctx context.Context, c redis.Cmdable, asking bool, required int, script *redis.Script, keys skeys, args []any) (reply *redis.Cmd, acked int, err error) {
	if !asking {
		if own := l.batchable(c); own != nil && !scriptArgs[script].full {
			b := &l.batch
			if required > 0 {
				b = &l.syncBatch // apart: see batcher
			}
			if !b.enter() {
				return l.evalBatched(ctx, b, own, required, script, keys, args)
			}
			defer b.leave()
		}
		if required == 0 {
			reply = runScript(ctx, c, script, keys, args)
			return reply, 0, reply.Err()
		}
	}
	pipe, pooled := l.pipeline(c)
	if pooled != nil {
		defer l.pipes.Put(pooled) // emptied by Exec
	}
	var sent time.Time
	if required > 0 {
		sent = time.Now()
	}
	firstAcked := -1 // the first WAIT's count, when the script is sent again
	for _, load := range [2]bool{false, true} {
		var cmds [3]redis.Cmder
		n := 0
		if asking {
			cmds[n] = redis.NewCmd(ctx, "ASKING")
			n++
		}
		extra := 0 // WAIT's arguments, made with the script command's
		if required > 0 {
			extra = 3
		}
		var waitArgs []any
		reply, waitArgs = scriptCmdAnd(ctx, script, load, keys, args, extra)
		cmds[n] = reply
		n++
		var wait *redis.Cmd
		if required > 0 {
			timeout := l.syncTimeoutOn(c)
			if load {
				timeout = redisconn.WaitLeft(timeout, sent, firstAcked, required)
			}
			if timeout != l.sync.Timeout {
				wait = redis.NewCmd(ctx, waitFor(waitArgs, required, timeout)...)
			} else {
				wait = redis.NewCmd(ctx, l.waitArgs(waitArgs, required)...)
			}
			cmds[n] = wait
			n++
		}
		if pooled != nil {
			_ = pooled.BatchProcess(ctx, cmds[:n]...) // one append: cmds stays on the stack
		} else {
			for _, cmd := range cmds[:n] {
				_ = pipe.Process(ctx, cmd)
			}
		}
		_, err := pipe.Exec(ctx)
		unanswered(cmds[:n], err)
		if wait != nil {
			readBeforeWait(reply, wait)
		}
		err = reply.Err()
		if !load && err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if wait != nil {
				if n, err := wait.Int(); err == nil {
					firstAcked = n
				}
			}
			continue
		}
		if err != nil {
			return reply, 0, err
		}
		if wait != nil {
			if acked, err = wait.Int(); err != nil {
				return reply, 0, waitError(err)
			}
		}
		break
	}
	return reply, acked, nil
}

// readBeforeWait clears the error of reply, a script command pipelined
// before wait, when its reply was read and only WAIT's did not come in
// time (see waitUnanswered): go-redis gives the error that ended a
// pipeline to every command without one of its own, those whose replies
// it read too (keeping their values). Otherwise the script's outcome is
// unknown (its reply was not read, or was lost with the connection), and
// reply keeps the error.
func readBeforeWait(reply, wait *redis.Cmd) {
	werr, err := wait.Err(), reply.Err()
	if werr == nil || err == nil || !replyRead(reply.Val()) {
		return
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return // the script's own error
	}
	if _, ok := waitError(werr).(*waitUnanswered); ok {
		reply.SetErr(nil)
	}
}

// replyRead reports whether v is a reply that was read in full: a reply
// whose read failed leaves nil, or a nil slice for an array cut short.
func replyRead(v any) bool {
	switch v := v.(type) {
	case nil:
		return false
	case []any:
		return v != nil
	}
	return true
}

// pipeline returns a pipeline on c: for the Locker's own client one from
// l.pipes, also returned as pooled to be put back once Exec has emptied it;
// for another (a cluster node's or a Ring shard's client) a new one.
//
// Only a *redis.Client's pipelines are pooled: its pipeline is bound to it
// for good. A caller's own UniversalClient may send a new pipeline elsewhere
// (it switched servers), and may be a type that == cannot compare, so it
// gets a new pipeline each time, as does a cluster node's or a Ring
// shard's client.
func (l *Locker) pipeline(c redis.Cmdable) (pipe redis.Pipeliner, pooled *redis.Pipeline) {
	own, _ := l.client.(*redis.Client)
	if rc, _ := c.(*redis.Client); own == nil || rc != own {
		return c.Pipeline(), nil
	}
	if p, _ := l.pipes.Get().(*redis.Pipeline); p != nil {
		return p, p
	}
	pipe = c.Pipeline()
	pooled, _ = pipe.(*redis.Pipeline)
	return pipe, pooled
}

// syncTimeoutOn is the timeout of a WAIT sent on c: the sync timeout, or
// less on a cluster node's or Ring shard's client that reads with a
// ReadTimeout the sync timeout does not fit in (with WAIT's clock tick):
// half of what the tick leaves of it, at least 1 ms, as New's default.
// New fits the sync timeout to the read timeout of the client it is given,
// but a ClusterOptions.NewClient or RingOptions.NewClient may make the
// node and shard clients with options of their own (a shorter
// ReadTimeout, or Sentinel failover clients with theirs), on which a WAIT
// of the full timeout ended in the node client's i/o timeout, not
// fence.ErrNotReplicated (TestRingShardReadTimeout,
// TestClusterNodeReadTimeout).
func (l *Locker) syncTimeoutOn(c redis.Cmdable) time.Duration {
	rc, ok := c.(*redis.Client)
	if !ok {
		return l.sync.Timeout
	}
	if own, _ := l.client.(*redis.Client); rc == own {
		return l.sync.Timeout // New fitted it
	}
	rt := rc.Options().ReadTimeout
	if rt <= 0 || l.sync.Timeout+waitTick < rt {
		return l.sync.Timeout
	}
	return max((rt-waitTick)/2, time.Millisecond)
}

// waitArgs fills args, three long, with the arguments of WAIT required
// Timeout, boxed once per required count, and returns it. Each command has
// arguments of its own, never shared: a hook may rewrite them in place, or
// keep them.
func (l *Locker) waitArgs(args []any, required int) []any {
	w := l.wait.Load()
	if w == nil || w.required != required {
		w = &waitCmdArgs{required, [2]any{required, l.sync.Timeout.Milliseconds()}}
		l.wait.Store(w)
	}
	args[0], args[1], args[2] = "WAIT", w.args[0], w.args[1]
	return args
}

// waitFor fills args with WAIT required timeout, for a timeout other than
// the Locker's (see redisconn.WaitLeft).
func waitFor(args []any, required int, timeout time.Duration) []any {
	args[0], args[1], args[2] = "WAIT", required, timeout.Milliseconds()
	return args
}

type waitCmdArgs struct {
	required int
	args     [2]any // required, Timeout in ms
}

// scriptCmd is the command that runs script by SHA (EVALSHA) or, with load,
// in full (EVAL), on keys with args, as redis.Script would send it. Built
// here, it costs an allocation less per command, two for the name and the
// SHA, which are boxed once (see scriptArgs), and one per key when keys
// come boxed (a lock name's keys are boxed once; see nameCache). args must
// be scalars (go-redis does not flatten them here).
func scriptCmd(ctx context.Context, script *redis.Script, load bool, keys skeys, args []any) *redis.Cmd {
	cmd, _ := scriptCmdAnd(ctx, script, load, keys, args, 0)
	return cmd
}

// scriptCmdAnd is scriptCmd, and a slice of extra elements for the
// arguments of the command that follows it in a pipeline (WAIT's), made in
// the same allocation: the two never overlap, and the script command's
// arguments are capped at their length, so that an append to them by a
// hook cannot reach the other's.
func scriptCmdAnd(ctx context.Context, script *redis.Script, load bool, keys skeys, args []any, extra int) (*redis.Cmd, []any) {
	nk := len(keys.names)
	n := 3 + nk + len(args)
	all := make([]any, n+extra)
	cmdArgs := all[:n:n]
	sa := scriptArgs[script]
	if load || sa.full {
		cmdArgs[0], cmdArgs[1] = "eval", sa.src
	} else {
		cmdArgs[0], cmdArgs[1] = "evalsha", sa.sha
	}
	cmdArgs[2] = nk
	if keys.boxed != nil {
		copy(cmdArgs[3:3+nk], keys.boxed)
	} else {
		for i, k := range keys.names {
			cmdArgs[3+i] = k
		}
	}
	copy(cmdArgs[3+nk:], args)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	if nk > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd, all[n:]
}

// scriptArgs are the SHA and the source of each script, boxed once for
// scriptCmd.
var scriptArgs = func() map[*redis.Script]struct {
	sha, src any
	full     bool // sent by EVAL only (redisconn.Script's Full)
} {
	m := make(map[*redis.Script]struct {
		sha, src any
		full     bool
	}, len(connScripts))
	for s, c := range connScripts {
		m[s] = struct {
			sha, src any
			full     bool
		}{c.SHA, c.Src, c.Full}
	}
	return m
}()

// int64s is reply.Int64Slice() appended to dst: without an allocation when
// the reply's integers fit in dst's capacity.
func int64s(reply *redis.Cmd, dst []int64) ([]int64, error) {
	vals, err := reply.Slice()
	if err != nil {
		return nil, err
	}
	for _, v := range vals {
		n, ok := v.(int64)
		if !ok {
			return reply.Int64Slice() // converts, or says why not
		}
		dst = append(dst, n)
	}
	return dst, nil
}

// runScript is script.Run(ctx, c, keys.names, args...) (EVALSHA, then
// EVAL on NOSCRIPT) with the commands of scriptCmd, on a *redis.Client (a
// plain, Sentinel failover or cluster node client); on any other client
// (the caller's own UniversalClient, which may route its script commands
// elsewhere than its Process), Run, or for a script sent in full its EVAL
// by Do: an AutoPipeliner sends Do on a connection of its own, where Eval
// waited in its next batch behind writes that a write pause held
// (TestStatusDuringWritePauseAutoPipeliner); other clients route Do by its
// key as they route Eval.
func runScript(ctx context.Context, c redis.Cmdable, script *redis.Script, keys skeys, args []any) *redis.Cmd {
	rc, ok := c.(*redis.Client)
	if !ok {
		if scriptArgs[script].full {
			if d, ok := c.(interface {
				Do(context.Context, ...any) *redis.Cmd
			}); ok {
				return d.Do(ctx, scriptCmd(ctx, script, true, keys, args).Args()...)
			}
			return script.Eval(ctx, c, keys.names, args...)
		}
		return script.Run(ctx, c, keys.names, args...)
	}
	cmd := scriptCmd(ctx, script, false, keys, args)
	if err := rc.Process(ctx, cmd); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = scriptCmd(ctx, script, true, keys, args)
		_ = rc.Process(ctx, cmd)
	}
	return cmd
}

// Bounds on following cluster redirections for one command.
const (
	maxRedirects    = 16                    // MOVED and ASK in a row
	tryAgainBackoff = 64 * time.Millisecond // the longest pause after TRYAGAIN
	tryAgainFor     = 5 * time.Second       // how long to retry TRYAGAIN: a migration left half done needs an operator
)

// onSlotMaster calls run with the client of the primary that owns key (on
// a cluster the slot master's node client, since a pipeline on the cluster
// client would send the key-less WAIT to any node; otherwise the client
// primaryFor names). On a cluster, when run fails with a redirection it follows it:
// after MOVED it calls run again on the named node; after ASK it calls run
// on the importing node with asking set, so that run sends ASKING first on
// the same connection; after TRYAGAIN (a multi-key script while a slot's
// keys are split between two nodes, or while the slot is open and some of
// the script's keys do not exist) it waits a little and starts over, until
// ctx ends or for at most 5 s, and then returns the TRYAGAIN error. The slot map of the cluster client is reloaded after
// MOVED, so later calls go to the new owner directly.
func (l *Locker) onSlotMaster(ctx context.Context, key string, run func(node string, c redis.Cmdable, asking bool) error) error {
	node, c, err := l.primaryFor(ctx, key)
	if err != nil {
		return err
	}
	cc, ok := l.client.(*redis.ClusterClient)
	if !ok {
		return run(node, c, false)
	}
	asking, redirects, backoff := false, 0, time.Millisecond
	var tryAgainUntil time.Time
	for {
		err := run(node, c, asking)
		if err == nil {
			return nil
		}
		moved, isMoved := redis.IsMovedError(err)
		ask, isAsk := redis.IsAskError(err)
		switch {
		case redis.IsTryAgainError(err):
			if tryAgainUntil.IsZero() {
				tryAgainUntil = time.Now().Add(tryAgainFor)
			} else if time.Now().After(tryAgainUntil) {
				return err
			}
			if !pause.For(ctx, backoff) {
				return err
			}
			backoff = min(2*backoff, tryAgainBackoff)
			if node, c, err = l.primaryFor(ctx, key); err != nil {
				return err
			}
			asking, redirects = false, 0
			continue
		case !isMoved && !isAsk:
			// A node that cannot be reached, or is no longer a master,
			// may have failed over: the next call should ask the
			// cluster's new slot map, not this one.
			var reply redis.Error
			if !errors.As(err, &reply) || redis.HasErrorPrefix(err, "READONLY") || redis.HasErrorPrefix(err, "CLUSTERDOWN") {
				cc.ReloadState(ctx)
			}
			return err
		case redirects == maxRedirects:
			return err
		case isMoved:
			cc.ReloadState(ctx)
			node, asking = moved, false
		default:
			node, asking = ask, true
		}
		redirects++
		if c, err = rediscluster.MasterByAddr(ctx, cc, node); err != nil {
			return err
		}
	}
}

// primaryFor returns the client of the primary that owns key and a name for
// it: on a cluster the slot owner's node client and its address; on a Ring
// the client of the shard the Ring puts key on (by its hash tag, so every
// key of a lock name) and its address; else the client itself and "".
//
// A Ring's own client must not carry replica sync's commands: it routes a
// key-less command (WAIT) to a shard of its own choosing, not to the one
// that ran the script, and the replica record's key to whichever shard it
// hashes to.
func (l *Locker) primaryFor(ctx context.Context, key string) (string, redis.Cmdable, error) {
	switch c := l.client.(type) {
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return "", nil, err
		}
		return node.Options().Addr, node, nil
	case *redis.Ring:
		shard, err := c.GetShardClientForKey(key)
		if err != nil {
			return "", nil, err
		}
		return shardName(shard), shard, nil
	}
	return "", l.client, nil
}

// shardReplaced reports whether try number try of a call on key, which
// failed with err, is to be made again: on a Ring, when the shard client
// it used was closed (redis.ErrClosed: nothing was sent) while the Ring
// itself is open and has a shard for key. Ring.SetAddrs closes the
// clients of the shards it replaces, and a call that picked one just
// before finds it closed. At most three tries: a shard client closed by
// hand stays closed, and the Ring keeps handing it out.
func (l *Locker) shardReplaced(try int, key string, err error) bool {
	return try < 3 && errors.Is(err, redis.ErrClosed) && l.ringServes(key)
}

// ringServes reports whether the Locker is on a Ring that is open and has
// a live shard for key.
func (l *Locker) ringServes(key string) bool {
	ring, ok := l.client.(*redis.Ring)
	if !ok {
		return false
	}
	_, err := ring.GetShardClientForKey(key)
	return err == nil
}

// shardName names a Ring's shard client for the replica-count cache: its
// address, or, for a Sentinel failover client (a Ring's NewClient may make
// them), whose address is "FailoverClient" for every shard, that and the
// client's identity.
func shardName(c *redis.Client) string {
	if addr := c.Options().Addr; addr != "FailoverClient" {
		return addr
	}
	return fmt.Sprintf("FailoverClient %p", c)
}
