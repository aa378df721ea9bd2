package redislock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/rediscluster"
	"github.com/fencekit/fence/internal/redisconn"
	"github.com/redis/go-redis/v9"
)

// ErrBadTokenRecord means the last-token record of a lock name holds
// something the acquire script cannot increase exactly: not a canonical
// decimal integer, or 2^53 - 1 or more (Lua, which runs the script, counts
// in doubles). fence never writes such a record; a foreign or tampered one
// is refused rather than risk a repeated or negative token. The error names
// the key; delete it, or set it to a valid token, to go on. Acquire wraps it
// in an error matching fence.ErrNotAcquired.
var ErrBadTokenRecord = errors.New("redislock: bad token record")

// errLateReply is in the error of a try that took the lock but whose reply
// came after the lease's deadline (counted from when the try was sent): the
// lease would have ended before Acquire returned it. The try is given up
// on (see lateReply).
// errBudgetConfirming says that the wait budget ran out on the try that
// confirmed a grant of the lock to the waiter (see grantConfirmation): the
// lock was the waiter's, given back since.
var errBudgetConfirming = errors.New("redislock: the wait budget ran out confirming a grant of the lock to this waiter, given back")

var errLateReply = fmt.Errorf("%w: redislock: the reply that took the lock came too late", fence.ErrLeaseLost) // matches fence.ErrLeaseLost: the lease ended before Acquire returned

// lateReply is the error of a try sent at sent whose reply, taking the lock
// for a lease of ttl, came at replied, past the lease's deadline.
func lateReply(sent, replied time.Time, ttl time.Duration) error {
	return fmt.Errorf("%w: %v after the try was sent, past the lease's deadline (lease time %v); given back", errLateReply, replied.Sub(sent).Round(time.Millisecond), ttl)
}

// scriptError turns the acquire script's refusal into ErrBadTokenRecord,
// explains a replica's (see onReplica) and leaves other errors as they are.
func scriptError(err error) error {
	if redis.HasErrorPrefix(err, "FENCETOKEN") {
		return fmt.Errorf("%w: %s", ErrBadTokenRecord, err.Error()[len("FENCETOKEN "):])
	}
	return onReplica(err)
}

// onReplica adds to err, when a replica refused the command (READONLY),
// the two ways that happens: a failover under way, which a wait retries,
// or a client that sends commands to a replica, such as a Sentinel client
// with ReplicaOnly, which can neither take a lock nor read one. New cannot
// refuse that client (go-redis keeps ReplicaOnly inside its dialer, and
// New sends nothing), and its bare READONLY, after a wait spent retrying
// it, did not say so (TestReplicaOnlyFailoverClient).
func onReplica(err error) error {
	if err == nil || !redis.HasErrorPrefix(err, "READONLY") {
		return err
	}
	return fmt.Errorf("%w (the command reached a replica: a failover under way, or a client that sends commands to replicas, such as redis.FailoverOptions.ReplicaOnly, through which locks can be neither taken nor read)", err)
}

// closedClient makes err, when a go-redis client was closed
// (redis.ErrClosed), match fence.ErrClosed too (fencerueidis's closed
// client's already does): a closed client grants no more leases, and
// fence.Lead stops campaigning on it.
func closedClient(err error) error {
	if errors.Is(err, redis.ErrClosed) && !errors.Is(err, fence.ErrClosed) {
		return fmt.Errorf("%w (%w)", err, fence.ErrClosed)
	}
	return err
}

// closedForGood reports whether err says the Locker's client was closed,
// for good: an error matching fence.ErrClosed (fencerueidis's client
// confirms it), or go-redis's redis.ErrClosed when a PING on the client
// fails with it too (a Ring's shard client replaced under the call gives
// redis.ErrClosed while the Ring serves; see shardReplaced).
func (l *Locker) closedForGood(ctx context.Context, err error) bool {
	switch {
	case errors.Is(err, fence.ErrClosed):
		return true
	case !errors.Is(err, redis.ErrClosed) || l.client == nil:
		return false
	}
	return errors.Is(l.client.Ping(ctx).Err(), redis.ErrClosed)
}

// transientPrefixes are Redis error codes that a failover, a restart or a
// resharding produces and that go away by themselves.
var transientPrefixes = []string{"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS", "BUSY", "UNBLOCKED"}

// transient reports whether err is worth retrying within a wait budget: the
// server is unreachable or timed out (on a Ring, every shard is marked
// down), is loading, is a replica (a failover in progress), refused for
// lack of replicas, or redirected to a cluster node that the slot map does
// not list yet (a node just added, which gossip will make known). Everything else is
// permanent and ends a wait at once: a wrong key type, auth or ACL errors,
// a TLS alert from the server (a client certificate refused or missing),
// ErrBadTokenRecord, a script error, a closed client, the caller's context.
func transient(err error) bool {
	switch {
	case err == nil,
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded) && !isNetTimeout(err),
		errors.Is(err, redis.ErrClosed), errors.Is(err, fence.ErrClosed), errors.Is(err, ErrBadTokenRecord):
		return false
	case errors.Is(err, fence.ErrNotReplicated), errors.Is(err, redisconn.ErrUnsubscribed), errors.Is(err, rediscluster.ErrUnlisted),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, redis.ErrPoolTimeout), isNetTimeout(err),
		// A pooled connection closed under the command (go-redis writes
		// to none: a Ring's shard replaced by SetAddrs, ci58), not the
		// client closed (redis.ErrClosed, above): as a broken
		// connection's *net.OpError below.
		errors.Is(err, net.ErrClosed):
		return true
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		// Dial, read or write on a broken connection; but not a TLS alert
		// the server sent ("remote error: tls: certificate required",
		// "bad certificate", "protocol version"): that is its answer to
		// this client, as an auth error is, and every retry gets it again.
		return opErr.Op != "remote error"
	}
	for _, p := range transientPrefixes {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	msg := err.Error()
	// A write inside a script on a just-demoted primary; a Sentinel
	// client that cannot reach a master during a failover.
	return strings.Contains(msg, "READONLY You can't write") ||
		strings.Contains(msg, "all sentinels specified in configuration are unreachable") ||
		ringDown(err)
}

// ringDown reports the error of a Ring whose shards are all marked down
// by its heartbeat: its shards may come back. It may follow a try the
// Ring sent before the last shard went down (go-redis retries a command
// on a broken connection), so it does not say that nothing was sent.
func ringDown(err error) bool {
	return strings.Contains(err.Error(), "redis: all ring shards are down")
}

// isNetTimeout reports a socket timeout. context.DeadlineExceeded is a
// net.Error too, with Timeout true; it is the caller's deadline, not the
// network's, and does not count.
func isNetTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && !errors.Is(ne, context.DeadlineExceeded)
}
