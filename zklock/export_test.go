package zklock

// Escape is escape, for the tests that look at the nodes.
var Escape = escape

// Listings returns how many times l listed a lock's directory.
func (l *Locker) Listings() int64 { return l.listings.Load() }
