package redislock

import "time"

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
