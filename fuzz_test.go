package fence_test

import (
	"errors"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/fencekit/fence"
)

// FuzzValidateName: no panic; a name is accepted iff it is 1 to MaxNameLen
// bytes of valid UTF-8 with no braces, no control characters and none of
// the invisible characters (lookalike), and a rejection matches
// ErrInvalidName.
func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"lock:payment:1001", "", "{", "a}", "a\x00", "\x7f", "\u0085", "\xc0", "결제:1001", "\ufeffa", "a\u200db", "a\u2060b", "a\u00adb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		want := name != "" && len(name) <= fence.MaxNameLen && utf8.ValidString(name)
		for _, r := range name {
			if r == '{' || r == '}' || unicode.IsControl(r) || lookalike(r) {
				want = false
			}
		}
		err := fence.ValidateName(name)
		if (err == nil) != want {
			t.Fatalf("ValidateName(%q) = %v, want valid %v", name, err, want)
		}
		if err != nil && !errors.Is(err, fence.ErrInvalidName) {
			t.Fatalf("ValidateName(%q): %v does not match ErrInvalidName", name, err)
		}
	})
}

// lookalike is the fuzz target's own list of the invisible characters that
// ValidateName refuses (see its doc).
func lookalike(r rune) bool {
	switch r {
	case 0xfeff, 0x200b, 0x2028, 0x2029, 0x061c, 0x200e, 0x200f:
		return true
	}
	return r >= 0x202a && r <= 0x202e || r >= 0x2060 && r <= 0x206f || r == 0x00ad || r == 0x180e
}
