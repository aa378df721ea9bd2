package redislock

import "time"

// SetClock replaces the clock l uses to age its cached replica counts.
func SetClock(l *Locker, now func() time.Time) { l.replicas.now = now }

// KnownReplicas exposes knownReplicas to the external tests.
var KnownReplicas = knownReplicas
