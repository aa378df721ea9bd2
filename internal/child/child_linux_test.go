package child_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/child"
)

// A parent killed by SIGKILL, with no chance to clean up, takes a child
// started with DieWithParent with it.
func TestDieWithParent(t *testing.T) {
	if os.Getenv("CHILD_TEST_PARENT") == "1" {
		c := exec.Command("sleep", "600")
		child.DieWithParent(c)
		if err := c.Start(); err != nil {
			os.Exit(2)
		}
		fmt.Println(c.Process.Pid)
		select {} // until killed
	}
	parent := exec.Command(os.Args[0], "-test.run=^TestDieWithParent$")
	parent.Env = append(os.Environ(), "CHILD_TEST_PARENT=1")
	stdout, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = parent.Process.Kill()
		t.Fatalf("parent did not report its child: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	_ = parent.Process.Kill()
	_ = parent.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("child %d still running 30s after its parent was killed", pid)
		}
		time.Sleep(10 * time.Millisecond) // polling for the kernel's kill, with a deadline
	}
}

// alive: the process exists and is not a zombie (the child is reparented
// to init, which reaps it in its own time).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
