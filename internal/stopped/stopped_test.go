package stopped

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// A sleeping process is not stopped; once SIGSTOP is taken, every thread
// is; after SIGCONT none is again.
func TestWait(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	if All(pid) {
		t.Fatal("a running process reported stopped")
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	Wait(pid, Limit)
	if !All(pid) {
		t.Fatalf("Wait returned with a thread of the paused process still running")
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(Limit)
	for All(pid) {
		if time.Now().After(deadline) {
			t.Fatal("the process still reads stopped after SIGCONT")
		}
		time.Sleep(time.Millisecond) // polling the kernel's view, with a deadline
	}
}

// A process that is gone is not waited for.
func TestGone(t *testing.T) {
	if !All(1 << 30) {
		t.Fatal("a pid that does not exist reads as running")
	}
}
