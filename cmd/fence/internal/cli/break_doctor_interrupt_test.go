package cli_test

import (
	"os"
	"strings"
	"syscall"
	"testing"
)

// SIGINT while fence doctor waits on a server that has not answered yet
// (here one that accepts and never answers, --timeout 60s): doctor stops at
// once, as it should, but it exited 2 saying "deployment unreachable ...
// context canceled": a claim about the deployment that it did not find
// (the server was still within --timeout), with the status --help gives to
// a deployment that "could not be read within --timeout". Every other
// command exits 130 (ExitInterrupted) on SIGINT; doctor should too, and
// say it was interrupted. The README gives 130 for SIGTERM too, and SIGHUP
// (a closed terminal or ssh session) ends fence as they do.
func TestDoctorInterrupted(t *testing.T) {
	t.Parallel()
	for _, sig := range []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			stderr := interruptConnected(t, func(addr string) []string {
				return []string{"doctor", "--timeout", "60s", "--redis", "redis://" + addr}
			}, sig)
			if strings.Contains(stderr, "unreachable") {
				t.Errorf("stderr claims the deployment unreachable after %v: %q", sig, stderr)
			}
		})
	}
}
