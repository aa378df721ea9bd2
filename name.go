package fence

import (
	"fmt"
	"unicode/utf8"
)

// MaxNameLen is the longest lock name accepted, in bytes.
const MaxNameLen = 256

// ValidateName checks a lock name. A name is 1 to MaxNameLen bytes of valid
// UTF-8 without control characters and without '{' or '}' (Redis Cluster
// uses braces to pick a key's slot, and fence adds its own). The returned
// error matches ErrInvalidName and says which rule was broken.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidName, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidName, name)
	}
	for i, r := range name {
		switch {
		case r == '{' || r == '}':
			return fmt.Errorf("%w: %q contains a brace at byte %d", ErrInvalidName, name, i)
		case r < 0x20 || (r >= 0x7f && r < 0xa0):
			return fmt.Errorf("%w: %q contains control character %U at byte %d", ErrInvalidName, name, r, i)
		}
	}
	return nil
}
