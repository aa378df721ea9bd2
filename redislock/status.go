package redislock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/nilctx"
)

// Status is what Redis holds for one lock name.
type Status struct {
	Held      bool          // the lock is held
	TTL       time.Duration // the holder's remaining lease; negative if held without expiry
	LastToken fence.Token   // the last token issued; 0 if the record has expired or never existed

	// Replicas are the replica counts of the primary that serves the
	// lock: how many replica sync expects (see ReplicaSync.Replicas) and
	// how many are connected. Fewer connected than expected means that
	// acquisitions wait for replicas that may not answer.
	Replicas ReplicaCounts

	// ReplicasErr is why the replica counts could not be read (then
	// Replicas is zero, which does not mean no replicas), or nil: the
	// ReplicaCounts error, such as a cluster client over servers not in
	// cluster mode (see ReplicaSync), or ctx ending after the lock was read.
	ReplicasErr error
}

// Status reads the state of the lock called name, and the replica counts of
// its primary, in two round trips. It changes nothing.
//
// The lock is read on its primary, by a script (EVAL) that no go-redis
// or rueidis client sends to a replica, even one that routes read-only
// commands to replicas (ClusterOptions.ReadOnly, RouteRandomly,
// RouteByLatency; rueidis's SendToReplicas): a replica may be behind its
// primary, and would call a held lock free. The script refuses to read on
// a replica, so on a client that sends every command to a replica
// (FailoverOptions.ReplicaOnly) Status fails with READONLY. It asks the
// server's role with INFO; for a user whose ACL refuses INFO it reads
// wherever it runs (and the replica counts, which need INFO too, are in
// ReplicasErr). A primary that refuses writes (min-replicas-to-write, a
// failed save) still answers it, and so does one that pauses them (CLIENT
// PAUSE WRITE, a switchover): that is when an operator reads the lock's
// state. Both scripts declare that they write nothing and are sent in
// full (EVAL, about 2 KB each): Redis holds back the EVALSHA of a script
// it has not cached (a primary just promoted or restarted), whose flags it
// cannot read, for the whole pause.
//
// An error means the lock could not be read. Replica counts that could not
// be read do not fail the call: the lock's state is what Status is for, a
// caller that returns on an error would drop it, and a client that can
// never read the counts (a cluster client over servers not in cluster
// mode, with replica sync off) could never tell it. Their error is in
// Status.ReplicasErr, and Replicas is then zero.
func (l *Locker) Status(ctx context.Context, name string) (Status, error) {
	if ctx == nil {
		return Status{}, nilctx.Err("redislock", "Status")
	}
	if err := l.made(); err != nil {
		return Status{}, err
	}
	if err := fence.ValidateName(name); err != nil {
		return Status{}, err
	}
	k := l.keys(name)
	state, err := bounded(ctx, &l.calls, func(ctx context.Context) ([]any, error) {
		reply, _, _, err := l.evalRouted(ctx, stateScript, skeys{names: []string{k.lock, k.token}, boxed: k.boxed[:2]})
		if err != nil {
			return nil, err
		}
		return reply.Slice()
	}, nil)
	if err != nil {
		return Status{}, fmt.Errorf("redislock: status %q: %w", name, onReplica(err))
	}
	var pttl int64
	var last string
	var found, ok bool
	if len(state) == 2 {
		pttl, ok = state[0].(int64)
		last, found = state[1].(string)
	}
	if !ok || !found && state[1] != nil {
		return Status{}, fmt.Errorf("redislock: status %q: unexpected reply %v", name, state)
	}
	var s Status
	switch pttl {
	case -2: // no such key
	case -1:
		s.Held, s.TTL = true, -1
	default:
		s.Held, s.TTL = true, time.Duration(pttl)*time.Millisecond
	}
	if found {
		n, err := strconv.ParseInt(last, 10, 64)
		if err != nil {
			return s, fmt.Errorf("redislock: status %q: bad token record %q", name, last)
		}
		s.LastToken = fence.Token(n)
	}
	if s.Replicas, err = l.ReplicaCounts(ctx, name); err != nil {
		s.Replicas, s.ReplicasErr = ReplicaCounts{}, err
	}
	return s, nil
}
