package child_test

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/child"
)

// A process that stops itself is seen stopped by its parent, and runs on
// once continued.
func TestStopSelf(t *testing.T) {
	if os.Getenv("CHILD_TEST_STOP") == "1" {
		if err := child.StopSelf(); err != nil {
			os.Exit(2)
		}
		os.Stdout.WriteString("continued\n")
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestStopSelf$")
	cmd.Env = append(os.Environ(), "CHILD_TEST_STOP=1")
	var out strings.Builder
	cmd.Stdout = &out
	child.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(cmd.Process.Pid, &ws, syscall.WUNTRACED, nil); err != nil {
		t.Fatal(err)
	}
	if !ws.Stopped() || ws.StopSignal() != syscall.SIGSTOP {
		t.Fatalf("child not stopped by SIGSTOP: status %#x (output %q)", ws, out.String())
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || out.String() != "continued\n" {
			t.Fatalf("after SIGCONT: %v, output %q", err, out.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("child did not exit after SIGCONT")
	}
}
