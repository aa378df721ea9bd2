//go:build linux

package cli_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
)

// closedPipe returns the write end of a pipe whose read end is closed:
// a log reader that died (fence exec ... 2>&1 | logger, logger gone).
func closedPipe(t *testing.T) *os.File {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Close()
	t.Cleanup(func() { _ = w.Close() })
	return w
}

// runUntil waits for cmd up to limit; past it the test fails.
func runUntil(t *testing.T, cmd *exec.Cmd, limit time.Duration) {
	t.Helper()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(limit):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatalf("fence exec still running %v on", limit)
	}
}

// TestExecLostLeaseStderrClosed: fence's stderr is a pipe nobody reads
// any more. The lock is deleted while the command runs: fence must still
// end the command's group (SIGTERM) and exit 76, not die of SIGPIPE on its
// "lease lost" line, which left the command's background process running
// with a lost lease (Pdeathsig kills the group's leader only) and gave the
// caller 141-style death by signal instead of 76.
func TestExecLostLeaseStderrClosed(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "--watchdog-ttl", "600ms", "--grace", "5s", "pipe-lost", "--",
		"sh", "-c", strings.ReplaceAll("sleep 60 & echo $! > D/bg.tmp; mv D/bg.tmp D/bg; wait", "D/", dir+"/"))
	cmd.Stderr = closedPipe(t)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	bg := watch(t, readPID(t, filepath.Join(dir, "bg")))
	if n := srv.Client(t).Del(context.Background(), "fence:{pipe-lost}").Val(); n != 1 {
		t.Fatalf("deleted %d keys, want the lock", n)
	}
	runUntil(t, cmd, time.Minute)
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() || ws.ExitStatus() != cli.ExitLeaseLost {
		t.Errorf("fence exec ended with %v (signal %v), want exit %d", cmd.ProcessState, ws.Signaled(), cli.ExitLeaseLost)
	}
	if !bg.exited(10 * time.Second) {
		t.Fatal("the command's background process runs on after its lease was lost")
	}
}

// TestExecLeftoverStderrClosed: the command exits and leaves a process
// that ignores SIGTERM; fence's stderr is a pipe nobody reads. fence must
// still SIGKILL the leftover and release the lock: its note "still running
// after SIGTERM; sending SIGKILL" must not kill fence with SIGPIPE, leaving
// the leftover running and the lock held by nobody until the watchdog
// TTL ran out.
func TestExecLeftoverStderrClosed(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "--grace", "200ms", "pipe-left", "--",
		"sh", "-c", strings.ReplaceAll(`(trap "" TERM; exec sleep 61) & echo $! > D/bg.tmp; mv D/bg.tmp D/bg`, "D/", dir+"/"))
	cmd.Stderr = closedPipe(t)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	bg := watch(t, readPID(t, filepath.Join(dir, "bg")))
	runUntil(t, cmd, time.Minute)
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() || ws.ExitStatus() != 0 {
		t.Errorf("fence exec ended with %v, want exit 0", cmd.ProcessState)
	}
	if !bg.exited(0) {
		t.Error("the leftover ignoring SIGTERM runs on after fence exec exited")
	}
	if n := srv.Client(t).Exists(context.Background(), "fence:{pipe-left}").Val(); n != 0 {
		t.Error("the lock is still held after fence exec exited")
	}
}

// TestExecChildStillGetsSIGPIPE: fence exec keeps going on a broken pipe,
// but the command it runs must not inherit that: a command writing to a
// closed stdout dies of SIGPIPE as it would without fence (exit 141), not
// of an EPIPE error it may not check (yes(1) would exit 1).
func TestExecChildStillGetsSIGPIPE(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "pipe-child", "--", "yes")
	cmd.Stdout = closedPipe(t)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	runUntil(t, cmd, time.Minute)
	if code := cmd.ProcessState.ExitCode(); code != 128+int(syscall.SIGPIPE) {
		t.Fatalf("fence exec -- yes into a closed pipe: %v, want exit %d", cmd.ProcessState, 128+int(syscall.SIGPIPE))
	}
}

// zombiesOf returns the zombie children of pid.
func zombiesOf(t *testing.T, pid int) []string {
	t.Helper()
	names, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) >= 2 && f[0] == "Z" && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// TestExecReapsOrphansWhileRunning: a long-running command whose
// subprocesses leave short-lived orphans (system("x &"), "(x &)" in a
// shell, a daemon's double fork): fence is their subreaper while the
// command runs, so they come back to fence when they exit. Before, fence
// reaped them only after the command exited: a leader running for days
// that does this piles up zombies under fence, each holding a pid, until
// the system runs out.
func TestExecReapsOrphansWhileRunning(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	const orphans = 20
	script := `i=0; while [ $i -lt ` + strconv.Itoa(orphans) + ` ]; do (true &); i=$((i+1)); done; touch D/forked; read x || true`
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "zombies", "--", "sh", "-c", strings.ReplaceAll(script, "D/", dir+"/"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stdin.Close(); runUntil(t, cmd, time.Minute) }()
	waitFile(t, filepath.Join(dir, "forked"))
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for ; ; <-tick.C {
		z := zombiesOf(t, cmd.Process.Pid)
		if len(z) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d zombies under fence exec 10s after the command's orphans exited, want 0 while it runs", len(z))
		}
	}
}
