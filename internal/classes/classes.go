// Package classes bounds the resource classes that fenceprom and fenceotel
// turn into label (attribute) values: a user's Classify over resources that
// come from requests can return a new class per request, and each would
// become a series kept for ever.
package classes

import (
	"strings"
	"sync"
)

// Other is the class that stands for every class past a Set's bound.
const Other = "other"

// Set admits the first max distinct classes. It is safe for concurrent use.
type Set struct {
	max  int
	mu   sync.Mutex
	seen map[string]struct{}
}

// New returns a Set that admits max classes (and Other past them).
func New(max int) *Set { return &Set{max: max, seen: map[string]struct{}{}} }

// Label returns class as a label value: its invalid UTF-8 replaced with
// U+FFFD (which client_golang refuses with a panic, and OTLP's protobuf
// encoding with an error on every export), or Other once max distinct
// classes were admitted before it; and whether it is the first time it
// returns that value.
func (s *Set) Label(class string) (string, bool) {
	class = strings.ToValidUTF8(class, "\uFFFD")
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[class]; ok {
		return class, false
	}
	if len(s.seen) >= s.max {
		class = Other
		_, ok := s.seen[class]
		s.seen[class] = struct{}{} // one beyond max at most
		return class, !ok
	}
	s.seen[class] = struct{}{}
	return class, true
}
