package fence

import (
	"fmt"
	"unicode/utf8"
)

// MaxNameLen is the longest lock name accepted, in bytes.
const MaxNameLen = 256

// ValidateName checks a lock name. A name is 1 to MaxNameLen bytes of valid
// UTF-8 without control characters, without '{' or '}' (Redis Cluster
// uses braces to pick a key's slot, and fence adds its own), and without
// the invisible characters that make two names print alike (see
// invisible). The returned error matches ErrInvalidName and says which
// rule was broken.
//
// Names are compared as bytes: fence does not normalize them, so the NFC
// and NFD spellings of "café" (macOS file names are NFD) are two locks.
// Normalize names built from such input before using them.
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
		case invisible(r):
			return fmt.Errorf("%w: %q contains invisible character %U at byte %d", ErrInvalidName, name, r, i)
		}
	}
	return nil
}

// invisible reports the characters a name may not hold because they print
// as nothing, or reorder what is printed, so that "lock:x" and a name read
// with a byte order mark, pasted with a zero-width space, or holding a bidi
// override (the "Trojan Source" characters) would be two locks that look
// the same in code, logs and fence status: the byte order mark (U+FEFF),
// the zero-width space (U+200B), the line and paragraph separators
// (U+2028, U+2029), and the bidi marks, embeddings, overrides and isolates
// (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069), and the
// other characters that print as nothing: the soft hyphen (U+00AD), the
// Mongolian vowel separator (U+180E), the word joiner (U+2060), the
// invisible operators (U+2061 to U+2064) and the deprecated format
// characters (U+206A to U+206F) (TestValidateNameMoreInvisibles). The zero-
// width joiner and non-joiner (U+200C, U+200D), which Persian words and
// emoji sequences need, stay valid.
func invisible(r rune) bool {
	switch {
	case r == 0xfeff, r == 0x200b, r == 0x2028, r == 0x2029:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2060 && r <= 0x206f:
		return true
	case r == 0x00ad, r == 0x180e:
		return true
	}
	return false
}
