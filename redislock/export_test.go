package redislock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// SetClock replaces the clock l uses to age its cached replica counts.
func SetClock(l *Locker, now func() time.Time) { l.replicas.now = now }

// KnownReplicas exposes knownReplicas to the external tests.
var KnownReplicas = knownReplicas

// Parked is how many give-backs l has parked (see parking).
func Parked(l *Locker) int {
	l.parking.mu.Lock()
	defer l.parking.mu.Unlock()
	return len(l.parking.parked)
}

// ReleaseKeys is how many keys the release script takes: the tests tell
// its calls from the acquire script's (5) by it.
const ReleaseKeys int64 = int64(len(attempt{}.releaseKeys))

// Revocations counts the revocation marks of the lock whose key is lock
// (value "1"), leaving out the marks of owners whose lease was released
// while others waited ("r", see release.lua).
func Revocations(ctx context.Context, c redis.Cmdable, lock string) int {
	n := 0
	for _, k := range c.Keys(ctx, lock+":revoked:*").Val() {
		if c.Get(ctx, k).Val() == "1" {
			n++
		}
	}
	return n
}
