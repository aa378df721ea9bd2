//go:build linux

package cli_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
)

// fullPipe returns a pipe whose buffer is full: a writer to w blocks until
// r is read (a log reader that stopped reading: "2>&1 | less" at its
// first page, a stuck log shipper).
func fullPipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	if err := syscall.SetNonblock(fds[1], true); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for {
		if _, err := syscall.Write(fds[1], buf); err != nil {
			if err != syscall.EAGAIN {
				t.Fatal(err)
			}
			break
		}
	}
	if err := syscall.SetNonblock(fds[1], false); err != nil {
		t.Fatal(err)
	}
	r, w = os.NewFile(uintptr(fds[0]), "r"), os.NewFile(uintptr(fds[1]), "w")
	t.Cleanup(func() { _ = r.Close(); _ = w.Close() })
	return r, w
}

// TestExecLostLeaseStderrBlocked: fence's stderr is a pipe nobody reads,
// full. The lock is deleted while the command (which ignores SIGTERM)
// runs: fence must still send SIGTERM, then SIGKILL after --grace. Before,
// it wrote its "lease lost" line first and blocked there: no signal
// reached the command, which ran on with a lost lease for as long as the
// reader stalled. (The command's own stderr goes elsewhere: a shell blocks
// writing "Terminated" for its sleep to a full pipe before it runs its
// trap.)
func TestExecLostLeaseStderrBlocked(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	r, w := fullPipe(t)
	script := `exec 2>/dev/null; echo $$ > D/pid.tmp; mv D/pid.tmp D/pid; trap 'touch D/term' TERM; while :; do sleep 0.05; done`
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "--watchdog-ttl", "600ms", "--grace", "300ms", "blocked", "--",
		"sh", "-c", strings.ReplaceAll(script, "D/", dir+"/"))
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		go func() { _, _ = io.Copy(io.Discard, r) }() // let fence finish
		runUntil(t, cmd, time.Minute)
		if code := cmd.ProcessState.ExitCode(); code != cli.ExitLeaseLost {
			t.Errorf("exit %d, want %d", code, cli.ExitLeaseLost)
		}
	}()
	leader := readPID(t, filepath.Join(dir, "pid"))
	if n := srv.Client(t).Del(context.Background(), "fence:{blocked}").Val(); n != 1 {
		t.Fatalf("deleted %d keys, want the lock", n)
	}
	waitFile(t, filepath.Join(dir, "term")) // fails after 30 s
	// SIGKILL after --grace, with stderr still blocked: the command's
	// group is gone.
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for ; syscall.Kill(-leader, 0) == nil; <-tick.C {
		if time.Now().After(deadline) {
			t.Fatal("the command's group still runs 20s after SIGTERM with --grace 300ms")
		}
	}
}

// TestExecServerGoneStderrBlocked: the Redis server dies while the
// command runs, and fence's stderr is a full pipe nobody reads. go-redis
// logs its failed dials (on the watchdog's renewals) to that stderr and
// blocks there; the lease must still end at its deadline and the command
// get SIGTERM.
func TestExecServerGoneStderrBlocked(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	r, w := fullPipe(t)
	script := `exec 2>/dev/null; trap 'touch D/term' TERM; touch D/started; while :; do sleep 0.05; done`
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "--watchdog-ttl", "1s", "--grace", "300ms", "gone", "--",
		"sh", "-c", strings.ReplaceAll(script, "D/", dir+"/"))
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		go func() { _, _ = io.Copy(io.Discard, r) }() // let fence finish
		runUntil(t, cmd, time.Minute)
		if code := cmd.ProcessState.ExitCode(); code != cli.ExitLeaseLost {
			t.Errorf("exit %d, want %d", code, cli.ExitLeaseLost)
		}
	}()
	waitFile(t, filepath.Join(dir, "started"))
	srv.Kill()
	killed := time.Now()
	waitFile(t, filepath.Join(dir, "term")) // fails after 30 s
	t.Logf("SIGTERM %v after the server died (--watchdog-ttl 1s)", time.Since(killed))
}
