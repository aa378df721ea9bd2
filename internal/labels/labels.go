// Package labels keeps the label (attribute) values that fenceprom and
// fenceotel have seen: the resource classes, bounded in number (a user's
// Classify over resources that come from requests can return a new class
// per request, and each would become a series kept for ever), and the
// backends, whose series are made at 0 when first seen.
package labels

import (
	"strings"
	"sync"
	"sync/atomic"
)

// Other is the class that stands for every class past a Classes' bound.
const Other = "other"

// Classes admits the first max distinct classes. It is safe for concurrent
// use.
type Classes struct {
	max  int
	mu   sync.Mutex
	seen map[string]struct{}
}

// NewClasses returns a Classes that admits max classes (and Other past
// them).
func NewClasses(max int) *Classes { return &Classes{max: max, seen: map[string]struct{}{}} }

// Label returns class as a label value: its invalid UTF-8 replaced with
// U+FFFD (which client_golang refuses with a panic, and OTLP's protobuf
// encoding with an error on every export), or Other once max distinct
// classes were admitted before it; and whether it is the first time it
// returns that value.
func (c *Classes) Label(class string) (string, bool) {
	class = strings.ToValidUTF8(class, "\uFFFD")
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[class]; ok {
		return class, false
	}
	if len(c.seen) >= c.max {
		class = Other
		_, ok := c.seen[class]
		c.seen[class] = struct{}{} // one beyond max at most
		return class, !ok
	}
	c.seen[class] = struct{}{}
	return class, true
}

// Seen is a set of values that is read on every event and written only
// when a value is new (backend names: a few, fixed): a read takes no lock
// and allocates nothing (a sync.Map boxed the key on every call). The zero
// Seen is empty and ready.
type Seen struct {
	mu  sync.Mutex
	set atomic.Pointer[map[string]struct{}] // replaced, never changed
}

// First reports whether v is new, and adds it.
func (s *Seen) First(v string) bool {
	if m := s.set.Load(); m != nil {
		if _, ok := (*m)[v]; ok {
			return false
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next := map[string]struct{}{v: {}}
	if m := s.set.Load(); m != nil {
		if _, ok := (*m)[v]; ok {
			return false
		}
		for k := range *m {
			next[k] = struct{}{}
		}
	}
	s.set.Store(&next)
	return true
}
