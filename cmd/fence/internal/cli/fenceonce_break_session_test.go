package cli_test

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
)

// TestErrorKeepsNameSayingFence: errorLine's collapse of a wrapped
// library error's "fence: " (TestErrorSaysFenceOnce) must not rewrite
// the lock name the error quotes: a name holding ": fence: " was printed
// without it, so the message named another lock, and the byte offset it
// gave pointed elsewhere in what was shown.
func TestErrorKeepsNameSayingFence(t *testing.T) {
	t.Parallel()
	const name = "job: fence: a{b}"
	_, errOut, code := fence(t, nil, "exec", name, "--", "true")
	if code != cli.ExitUsage || !strings.Contains(errOut, `"`+name+`"`) {
		t.Errorf("fence exec %q: exit %d, stderr %q: want exit %d and the name as given", name, code, errOut, cli.ExitUsage)
	}
	if strings.Count(errOut, "fence: invalid") != 1 || !strings.HasPrefix(errOut, "fence: ") {
		t.Errorf("stderr %q: want one leading \"fence: \" before the library's text", errOut)
	}
}
