package fence_test

import (
	"errors"
	"testing"

	"github.com/fencekit/fence"
)

// The invisible characters ValidateName refuses missed others that print as
// nothing in a log or fence status, so that "lock:payment:1001" and a name
// holding one are two locks that look the same: the soft hyphen (U+00AD,
// shown only at a line break), the Mongolian vowel separator (U+180E, a
// zero-width space since Unicode 6.3), the word joiner (U+2060, the
// zero-width space's no-break twin; a BOM inside text is read as one), the
// invisible operators (U+2061 to U+2064), and the deprecated format
// characters U+206A to U+206F.
func TestValidateNameMoreInvisibles(t *testing.T) {
	for _, r := range []rune{0x00ad, 0x180e, 0x2060, 0x2061, 0x2062, 0x2063, 0x2064, 0x206a, 0x206f} {
		name := "lock:payment" + string(r) + ":1001"
		if err := fence.ValidateName(name); !errors.Is(err, fence.ErrInvalidName) {
			t.Errorf("ValidateName(%q) (%U) = %v, want ErrInvalidName", name, r, err)
		}
	}
}
