package redlock

import "time"

// SetBeforeReplies makes every acquisition of l call f after sending its
// requests and before reading the replies.
func SetBeforeReplies(l *Locker, f func()) { l.beforeReplies = f }

// SetClock replaces the clock that times acquisitions against their
// validity and from which they propose their token floor.
func SetClock(l *Locker, now func() time.Time) { l.now = now }
