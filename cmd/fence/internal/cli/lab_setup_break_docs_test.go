package cli_test

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
)

// TestLabOutsideCheckoutIsNotAFailedExpectation: fence lab run from outside
// a checkout (an installed binary, say) cannot build its worker. That is no
// verdict: it must exit 2, not 1, which "fence lab --help" gives to "an
// expectation fails" (a control without its violation, or a violation in a
// protected run), what a CI script reads as the lab finding a safety
// problem. Before, it exited 1.
func TestLabOutsideCheckoutIsNotAFailedExpectation(t *testing.T) {
	t.Parallel()
	cmd := exec.CommandContext(t.Context(), fenceBin, "lab", "--quick", "--scenario", "1")
	cmd.Dir = t.TempDir() // no go.mod here or above
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	_ = cmd.Run()
	code := cmd.ProcessState.ExitCode()
	if code != cli.ExitUsage || !strings.Contains(stderr.String(), "checkout") {
		t.Fatalf("fence lab outside a checkout: exit %d, stderr %q; want exit %d saying it needs a checkout", code, stderr.String(), cli.ExitUsage)
	}
}
