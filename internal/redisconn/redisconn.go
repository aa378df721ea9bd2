// Package redisconn is the seam between redislock's lock algorithm and a
// Redis client other than go-redis: the few Redis interactions redislock
// makes, as one small interface, and the hook through which a sibling
// module (fencerueidis) builds a *redislock.Locker on it.
//
// redislock calls go-redis directly (its allocation floor is measured in
// redislock/alloc_test.go); a Locker built on a Conn sends the same
// commands, the same scripts with the same keys and arguments, through it
// instead. The interactions are:
//
//   - a script by SHA (EVALSHA), sent again in full (EVAL) on NOSCRIPT,
//     optionally followed on the same connection and in the same round
//     trip by WAIT (replica sync): acquire, extend, release and the
//     replica-record script (which reads INFO replication on the server)
//     and the lock-state script of Locker.Status (PTTL and GET);
//   - SUBSCRIBE to a lock's release channel, held while someone waits;
//   - whether the client ends its calls at the context's deadline.
//
// Redis Cluster (routing, redirections, SSUBSCRIBE) stays go-redis's: a
// Conn is one primary, standalone or behind Sentinel.
package redisconn

import (
	"context"
	"errors"
	"time"
)

// Script is one of redislock's Lua scripts.
type Script struct {
	Src string // the source, sent by EVAL
	SHA string // its SHA-1, sent by EVALSHA

	// Full says to send the script by EVAL only, never by EVALSHA: a
	// read-only script (flags=no-writes) that must run while the server
	// holds writes back (CLIENT PAUSE WRITE, a switchover). Redis reads
	// the flags of a script it has not cached from its source; the EVALSHA
	// of a SHA it does not know (a primary just promoted or restarted) is
	// held back as a possible write for the whole pause.
	Full bool
}

// Conn is a Redis client that a redislock Locker can run on. Replies are
// in go-redis's shapes: int64, string, []any of those, nil for a nil reply.
// An error reply from the server must be an error with a RedisError method
// (such as Error), so that redislock can read its code; network errors and
// the context's error are returned as the client gives them.
type Conn interface {
	// Eval runs s on keys and args (strings and integers) by EVALSHA,
	// and by EVAL if the server answers NOSCRIPT. When replicas > 0,
	// WAIT replicas timeout follows it on the same connection in the
	// same round trip, and acked is WAIT's reply. When the script ran
	// but WAIT failed, Eval returns the script's reply and an error
	// matching ErrWait (with WAIT's own), so that redislock gives back
	// what the script took.
	Eval(ctx context.Context, s *Script, keys []string, args []any, replicas int, timeout time.Duration) (reply any, acked int, err error)

	// Subscribe subscribes to channel and returns when ctx ends or the
	// subscription breaks (with the reason). It calls ready when the
	// server confirms the subscription, again after any resubscription,
	// and message with the payload of every message on channel, on one
	// goroutine. A subscription ended by an UNSUBSCRIBE it did not ask
	// for (the client's connection is shared) returns ErrUnsubscribed.
	Subscribe(ctx context.Context, channel string, ready func(), message func(payload string)) error

	// SelfBounded reports whether every call ends by its context's
	// deadline without help (a socket deadline, a pool wait, a dial).
	// When false, redislock runs calls with a deadline on goroutines it
	// can leave.
	SelfBounded() bool
}

// ErrWait is matched by the error of an Eval whose script ran and whose
// WAIT failed (refused by an ACL, the connection lost between the two).
var ErrWait = errors.New("WAIT failed after the script ran")

// ErrUnsubscribed is Subscribe's error when the server ended the
// subscription with an UNSUBSCRIBE sent by someone else on the same
// connection (another Locker on the same client whose last waiter left),
// or sent late by the Locker itself for an earlier subscription. It is
// not the caller's fault and not lasting: redislock subscribes again.
var ErrUnsubscribed = errors.New("the subscription was ended by an UNSUBSCRIBE on the client's connection")

// WaitLeft is the timeout of the WAIT sent again with a script refused
// with NOSCRIPT, given what the WAIT pipelined with the refused script
// counted (acked, negative when it failed) of the required replicas.
//
// When that WAIT counted fewer than required it waited out the timeout (a
// replica missing, as after a failover to a server that has no script
// cached, when replicas are often not back yet): a second one in full
// would make the call wait twice what its caller allowed, so it gets what
// is left of timeout since the first pipeline went out at sent, at least a
// millisecond (WAIT 0 would block for ever).
//
// When it counted enough, the replicas were keeping up and any time spent
// went elsewhere (a busy server, a slow round trip): the second WAIT is
// the first that waits for this call's write, and gets the whole timeout,
// as it would with the script cached. Left a millisecond, it would refuse
// an acquisition that a replica a little slow confirms in time.
func WaitLeft(timeout time.Duration, sent time.Time, acked, required int) time.Duration {
	if acked >= required {
		return timeout
	}
	return max(timeout-time.Since(sent), time.Millisecond)
}

// Error is a Redis error reply, such as "NOSCRIPT No matching script". Its
// RedisError method makes go-redis's error helpers (HasErrorPrefix) read it.
type Error string

// Error returns the reply's text.
func (e Error) Error() string { return string(e) }

// RedisError marks e as a server's reply.
func (Error) RedisError() {}

// NewLocker builds a *redislock.Locker on c with opts (a *redislock.Options,
// or nil), returned as any since redislock imports this package. redislock
// sets it in its init.
var NewLocker func(c Conn, opts any) (any, error)
