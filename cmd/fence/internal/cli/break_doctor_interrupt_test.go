package cli_test

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
)

// SIGINT while fence doctor waits on a server that has not answered yet
// (here one that accepts and never answers, --timeout 60s): doctor stops at
// once, as it should, but it exited 2 saying "deployment unreachable ...
// context canceled": a claim about the deployment that it did not find
// (the server was still within --timeout), with the status --help gives to
// a deployment that "could not be read within --timeout". Every other
// command exits 130 (ExitInterrupted) on SIGINT; doctor should too, and
// say it was interrupted.
func TestDoctorInterrupted(t *testing.T) {
	t.Parallel()
	addr, accepted := acceptingHole(t)
	cmd := exec.Command(fenceBin, "doctor", "--timeout", "60s", "--redis", "redis://"+addr)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-accepted:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("fence doctor never connected to %s", addr)
	}
	start := time.Now()
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	code, d := cmd.ProcessState.ExitCode(), time.Since(start)
	if code != cli.ExitInterrupted || d > 3*time.Second {
		t.Errorf("exit %d %v after SIGINT (stderr %q), want %d within 3 s", code, d.Round(time.Millisecond), stderr.String(), cli.ExitInterrupted)
	}
	if strings.Contains(stderr.String(), "unreachable") {
		t.Errorf("stderr claims the deployment unreachable after SIGINT: %q", stderr.String())
	}
}
