package fence_test

import (
	"errors"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/fencekit/fence"
)

// FuzzValidateName: no panic; a name is accepted iff it is 1 to MaxNameLen
// bytes of valid UTF-8 with no braces and no control characters, and a
// rejection matches ErrInvalidName.
func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"lock:payment:1001", "", "{", "a}", "a\x00", "\x7f", "\u0085", "\xc0", "결제:1001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		want := name != "" && len(name) <= fence.MaxNameLen && utf8.ValidString(name)
		for _, r := range name {
			if r == '{' || r == '}' || unicode.IsControl(r) {
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
