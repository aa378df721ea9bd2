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

// ReleaseKeys is how many keys the release script takes: the tests tell
// its calls from the acquire script's (5) by it.
const ReleaseKeys int64 = int64(len(attempt{}.releaseKeys))

// OthersWait reports whether an Acquire of l other than owner's ("": any)
// waits for name's lock, as a try's choice to go without WAIT reads it.
func OthersWait(l *Locker, name, owner string) bool {
	return l.othersWait(l.keys(name).channel, owner)
}
