//go:build linux

package cli_test

import (
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redistest"
)

// TestExecSetuidCommandDiesWithFence: fence is killed with SIGKILL while
// it runs a set-user-ID command (sudo, su, or any program that changes
// its effective user at exec). The kernel clears Pdeathsig when an exec
// changes the credentials, so the command runs on, unfenced by any lease
// once the lock expires. fence now runs the command under a shim (fence
// re-executed, never set-user-ID) that ends the command's group when fence
// dies.
func TestExecSetuidCommandDiesWithFence(t *testing.T) {
	suid := setuidSleep(t)
	srv := redistest.Start(t)
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "setuid", "--", suid, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var child int
	deadline := time.Now().Add(30 * time.Second)
	for child == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the command did not start within 30s")
		}
		exes, _ := filepath.Glob("/proc/[0-9]*/exe")
		for _, e := range exes {
			if target, _ := os.Readlink(e); target == suid {
				child, _ = strconv.Atoi(filepath.Base(filepath.Dir(e)))
			}
		}
	}
	p := watch(t, child)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if !p.exited(10 * time.Second) {
		t.Fatal("the set-user-ID command still runs 10s after fence was killed")
	}
}

// setuidSleep returns a set-user-ID copy of sleep owned by nobody, whose
// exec changes the effective user (and clears Pdeathsig).
func setuidSleep(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root to make a set-user-ID copy of sleep owned by nobody")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	suid := filepath.Join(dir, "sleep")
	src, err := os.Open("/bin/sleep")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(suid, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	_ = dst.Close()
	if err := os.Chown(suid, uid, -1); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(suid, os.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}
	return suid
}
