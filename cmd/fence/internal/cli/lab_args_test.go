package cli_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
)

// TestLabUsageErrors: an unknown --scenario and an --out that cannot be
// written are usage errors (exit 2) before anything runs. Before, the first
// ran nothing and exited 1 with "a control showed no violation or a
// protected run showed one"; the second ran every scenario and failed only
// when it came to write the report.
func TestLabUsageErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"lab", "--scenario", "99"}, "no scenario 99"},
		{[]string{"lab", "--scenario", "1,0"}, "no scenario 0"},
		{[]string{"lab", "--quick", "--scenario", "1", "--out", "/proc/no/such/dir"}, "--out"},
		{[]string{"lab", "--quick", "--scenario", "1", "--out", filepath.Join("/dev/null", "x")}, "--out"},
	} {
		start := time.Now()
		_, errOut, code := fence(t, nil, c.args...)
		if code != cli.ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("fence %v: exit %d, stderr %q; want exit %d naming %q", c.args, code, errOut, cli.ExitUsage, c.want)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("fence %v took %v: the usage error should come before any run", c.args, d)
		}
	}
}
