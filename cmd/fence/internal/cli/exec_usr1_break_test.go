//go:build linux

package cli_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redistest"
)

// TestExecPassesUSR1: SIGUSR1 or SIGUSR2 sent to fence (systemd's MainPID
// with "ExecReload=kill -USR1 $MAINPID", a log rotation asking the
// service to reopen its logs) reaches the command, as SIGHUP does. Before,
// it ended fence (Go's default for an unhandled SIGUSR1): the command
// was killed with SIGKILL by Pdeathsig, whatever it had started in the
// background ran on, and the lock stayed held until its TTL.
func TestExecPassesUSR1(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	script := `trap 'touch D/usr1' USR1; trap 'touch D/usr2; exit 0' USR2; touch D/started; while :; do sleep 0.05; done`
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "usr", "--", "sh", "-c", strings.ReplaceAll(script, "D/", dir+"/"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(dir, "started"))
	for _, s := range []struct {
		sig  syscall.Signal
		file string
	}{{syscall.SIGUSR1, "usr1"}, {syscall.SIGUSR2, "usr2"}} {
		if err := cmd.Process.Signal(s.sig); err != nil {
			t.Fatal(err)
		}
		waitFile(t, filepath.Join(dir, s.file)) // fails after 30 s
	}
	runUntil(t, cmd, time.Minute)
	if !cmd.ProcessState.Success() {
		t.Errorf("fence exec: %v, want exit 0 (the command's); stderr: %s", cmd.ProcessState, stderr.String())
	}
	if n := srv.Client(t).Exists(context.Background(), "fence:{usr}").Val(); n != 0 {
		t.Error("the lock is still held after fence exec exited")
	}
}
