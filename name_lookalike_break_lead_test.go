package fence_test

import (
	"errors"
	"testing"

	"github.com/fencekit/fence"
)

// Two processes that mean the same lock must use the same bytes, or they
// exclude nothing, silently. ValidateName accepts names that print alike
// but are other locks: a name read from a file that starts with a BOM, one
// pasted with a zero-width space, one holding a bidi override (the
// "Trojan Source" characters: a log shows it reordered), one with a line
// separator; and (not checked below: it needs x/text) the NFD spelling of
// a name that another process has in NFC (macOS file names are NFD).
func TestValidateNameLookalikes(t *testing.T) {
	t.Skip("design question: ValidateName accepts invisible format characters (U+FEFF, U+200B, bidi controls U+202A–U+202E and U+2066–U+2069, U+2028/U+2029) and non-NFC names, so \"lock:x\" and \"\\ufefflock:x\" (or NFC and NFD \"café\") are two locks that print alike; " +
		"rejecting all of Unicode's Cf category would refuse ZWNJ and ZWJ, which Persian words and emoji sequences need, and checking NFC needs golang.org/x/text in the root module (\"go-redis and little else\"). " +
		"The fix I would choose: refuse U+FEFF, U+200B, U+2028, U+2029 and the bidi controls with ErrInvalidName naming the code point (no new dependency), and document that names are compared as bytes, not normalized; changing which names are valid needs the maintainers' word, since existing locks under such names would stop working")
	for _, bad := range []string{
		"\ufefflock:payment:1001",
		"lock:payment:1001\u200b",
		"lock:\u202epayment:1001",
		"lock:\u2066payment\u2069:1001",
		"lock:payment\u2028:1001",
	} {
		if err := fence.ValidateName(bad); !errors.Is(err, fence.ErrInvalidName) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalidName", bad, err)
		}
	}
	for _, ok := range []string{"lock:café", "قفل:\u200cپرداخت", "lock:👨\u200d👩\u200d👧"} {
		if err := fence.ValidateName(ok); err != nil {
			t.Errorf("ValidateName(%q) = %v, want nil", ok, err)
		}
	}
}
