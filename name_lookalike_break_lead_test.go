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
// separator. Decided: those are refused (ErrInvalidName naming the code
// point); the zero-width joiner and non-joiner, which Persian words and
// emoji sequences need, stay valid; and names are compared as bytes, not
// normalized (documented in ValidateName: the NFD spelling of a name that
// another process has in NFC is another lock; checking it would need
// golang.org/x/text in the root module).
func TestValidateNameLookalikes(t *testing.T) {
	for _, bad := range []string{
		"\ufefflock:payment:1001",
		"lock:payment:1001\u200b",
		"lock:\u202epayment:1001",
		"lock:\u2066payment\u2069:1001",
		"lock:payment\u2028:1001",
		"lock:payment\u2029:1001",
		"lock:\u200epayment:1001",
		"lock:\u200fpayment:1001",
		"lock:\u061cpayment:1001",
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
