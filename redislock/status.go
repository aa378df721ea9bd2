package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fencekit/fence"
	"github.com/redis/go-redis/v9"
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
}

// Status reads the state of the lock called name, and the replica counts of
// its primary, in two round trips. It changes nothing.
func (l *Locker) Status(ctx context.Context, name string) (Status, error) {
	if err := l.made(); err != nil {
		return Status{}, err
	}
	if err := fence.ValidateName(name); err != nil {
		return Status{}, err
	}
	k := l.keys(name)
	if l.conn != nil {
		return l.statusConn(ctx, name, k)
	}
	pipe := l.client.Pipeline()
	pttl := pipe.PTTL(ctx, k.lock)
	last := pipe.Get(ctx, k.token)
	_, err := bounded(ctx, &l.calls, func(ctx context.Context) ([]redis.Cmder, error) { return pipe.Exec(ctx) }, nil)
	if err != nil && !errors.Is(err, redis.Nil) {
		return Status{}, fmt.Errorf("redislock: status %q: %w", name, err)
	}
	var s Status
	switch ttl := pttl.Val(); {
	case ttl == -2: // no such key (go-redis passes -2 and -1 through unscaled)
	case ttl == -1:
		s.Held, s.TTL = true, -1
	default:
		s.Held, s.TTL = true, ttl
	}
	v, err := last.Result()
	return l.status(ctx, name, s, v, err == nil)
}

// status completes s, read for name, with the token record v (if found)
// and the replica counts.
func (l *Locker) status(ctx context.Context, name string, s Status, v string, found bool) (Status, error) {
	if found {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return s, fmt.Errorf("redislock: status %q: bad token record %q", name, v)
		}
		s.LastToken = fence.Token(n)
	}
	r, err := l.ReplicaCounts(ctx, name)
	if err != nil {
		return s, fmt.Errorf("redislock: status %q: %w", name, err)
	}
	s.Replicas = r
	return s, nil
}
