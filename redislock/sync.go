package redislock

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

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
// error matching fence.ErrNotReplicated (with a wait budget, it first tries
// again, with back-off, until the budget ends). Renewals are confirmed the same way;
// an unconfirmed renewal does not move the lease's deadline.
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
	// AcksAll. Zero means 1, Redisson's rule.
	Acks int

	// Replicas is how many replicas the primary is expected to have. Zero
	// means discover: the largest connected_slaves that INFO replication
	// reported over the last 30 s (read at most every 10 s). A replica that
	// disconnects still counts until then, so the check fails closed instead
	// of being skipped. A process that starts while every replica is cut
	// off sees none; set Replicas where that matters.
	Replicas int

	// Timeout bounds each WAIT. Default 1 s (Redisson's slavesSyncTimeout).
	Timeout time.Duration

	_ struct{}
}

const (
	replicaReadEvery = 10 * time.Second
	replicaMemory    = 30 * time.Second
)

// replicaCounts tracks the expected replica count of each primary.
type replicaCounts struct {
	mu    sync.Mutex
	nodes map[string]*nodeReplicas // by node address; "" for a non-cluster client
}

type nodeReplicas struct {
	replid   string // master_replid: a new one means a new primary
	readings []replicaReading
	lastRead time.Time
	stale    bool // a WAIT saw more replicas than expected
}

type replicaReading struct {
	at time.Time
	n  int
}

// expected returns how many replicas node should have, reading INFO
// replication through c when the cached figure is old or marked stale.
func (rc *replicaCounts) expected(ctx context.Context, node string, c redis.Cmdable, force bool) (int, error) {
	rc.mu.Lock()
	nr := rc.nodes[node]
	if nr == nil {
		nr = &nodeReplicas{}
		rc.nodes[node] = nr
	}
	now := time.Now()
	fresh := !nr.stale && now.Sub(nr.lastRead) < replicaReadEvery && (!force || now.Sub(nr.lastRead) < time.Second)
	if fresh {
		n := nr.max(now)
		rc.mu.Unlock()
		return n, nil
	}
	rc.mu.Unlock()

	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return 0, err
	}
	n, replid := parseReplication(info)

	rc.mu.Lock()
	defer rc.mu.Unlock()
	if replid != nr.replid {
		nr.replid, nr.readings = replid, nil
	}
	nr.readings = append(nr.readings, replicaReading{at: now, n: n})
	nr.lastRead, nr.stale = now, false
	return nr.max(now), nil
}

// max is the largest reading within replicaMemory; older ones are dropped.
func (nr *nodeReplicas) max(now time.Time) int {
	keep := nr.readings[:0]
	m := 0
	for _, r := range nr.readings {
		if now.Sub(r.at) <= replicaMemory {
			keep = append(keep, r)
			m = max(m, r.n)
		}
	}
	nr.readings = keep
	return m
}

func (rc *replicaCounts) markStale(node string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if nr := rc.nodes[node]; nr != nil {
		nr.stale = true
	}
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

// required applies the acknowledgement rule to the expected replica count.
func (s *ReplicaSync) required(expected int) int {
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

// evalSynced runs script on the primary that owns key and, when replica
// sync applies there, WAIT on the same connection in the same round trip.
// It returns the script's reply, and how many replicas acknowledged and
// were required (both zero when no sync applied).
func (l *Locker) evalSynced(ctx context.Context, script *redis.Script, keys []string, args ...any) (reply *redis.Cmd, acked, required int, err error) {
	if l.sync.Disabled {
		reply = script.Run(ctx, l.client, keys, args...)
		return reply, 0, 0, reply.Err()
	}
	node, c, err := l.primaryFor(ctx, keys[0])
	if err != nil {
		return nil, 0, 0, err
	}
	expected := l.sync.Replicas
	if expected == 0 {
		if expected, err = l.replicas.expected(ctx, node, c, false); err != nil {
			return nil, 0, 0, err
		}
	}
	required = l.sync.required(expected)
	if required == 0 {
		reply = script.Run(ctx, c, keys, args...)
		return reply, 0, 0, reply.Err()
	}
	for _, load := range []bool{false, true} {
		pipe := c.Pipeline()
		if load {
			reply = script.Eval(ctx, pipe, keys, args...)
		} else {
			reply = script.EvalSha(ctx, pipe, keys, args...)
		}
		wait := pipe.Do(ctx, "WAIT", required, l.sync.Timeout.Milliseconds())
		_, _ = pipe.Exec(ctx)
		if !load && redis.HasErrorPrefix(reply.Err(), "NOSCRIPT") {
			continue
		}
		if err := reply.Err(); err != nil {
			return reply, 0, required, err
		}
		if acked, err = wait.Int(); err != nil {
			return reply, 0, required, err
		}
		break
	}
	if acked > expected {
		l.replicas.markStale(node)
	}
	if acked < required && l.sync.Replicas == 0 {
		// The topology may have changed (a failover): read it again now.
		if expected, err := l.replicas.expected(ctx, node, c, true); err == nil {
			required = min(required, l.sync.required(expected))
		}
	}
	return reply, acked, required, nil
}

// primaryFor returns the client of the primary that owns key and a name for
// it: on a cluster the slot owner's node client (a pipeline on the cluster
// client would send the key-less WAIT to any node), else the client itself.
func (l *Locker) primaryFor(ctx context.Context, key string) (string, redis.Cmdable, error) {
	cc, ok := l.client.(*redis.ClusterClient)
	if !ok {
		return "", l.client, nil
	}
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return "", nil, err
	}
	return node.Options().Addr, node, nil
}
