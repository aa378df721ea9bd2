package zklock

// Escape is escape, for the tests that look at the nodes.
var Escape = escape

// Listings returns how many times l listed a lock's directory.
func (l *Locker) Listings() int64 { return l.listings.Load() }

// Probes returns how many probes of the negotiated session timeout l
// started.
func (l *Locker) Probes() int64 { return l.probes.Load() }

// Background returns how many of l's background deletes and probe Closes
// are running.
func (l *Locker) Background() int64 { return l.background.Load() }

// Following returns how many leases s retimes at each grant.
func (s *SessionTimeouts) Following() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.leases)
}
