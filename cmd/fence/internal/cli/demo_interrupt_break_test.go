package cli_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
)

// TestDemoInterrupted: Ctrl-C in the middle of fence demo's stories ends it
// at once with exit 130, as it ends exec and status, and leaves nothing in
// TMPDIR (each story's SQLite file and directory, and the failover stories'
// redis-server directories, are removed). Before, the interrupted demo
// exited 2, the code for a usage or connection error.
func TestDemoInterrupted(t *testing.T) {
	for _, at := range []string{"Story 2:", "A's 10 s lease runs out", "the replica's link breaks", "Story 6:"} {
		t.Run(at, func(t *testing.T) {
			tmp := t.TempDir()
			args := []string{"demo", "--no-failover"}
			if strings.Contains(at, "replica") || at == "Story 6:" {
				args = args[:1] // the failover stories: real redis-server processes in TMPDIR
			}
			cmd := exec.Command(fenceBin, args...)
			cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			seen := make(chan struct{})
			go func() {
				sc := bufio.NewScanner(out)
				found := false
				for sc.Scan() {
					if !found && strings.Contains(sc.Text(), at) {
						found = true
						close(seen)
					}
				}
			}()
			select {
			case <-seen:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("fence demo never printed %q", at)
			}
			start := time.Now()
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			if code, d := cmd.ProcessState.ExitCode(), time.Since(start); code != cli.ExitInterrupted || d > 5*time.Second {
				t.Errorf("exit %d %v after SIGINT (stderr %q), want %d within 5 s", code, d.Round(time.Millisecond), stderr.String(), cli.ExitInterrupted)
			}
			if left, _ := os.ReadDir(tmp); len(left) != 0 {
				t.Errorf("the interrupted demo left %d entries in TMPDIR, e.g. %s", len(left), left[0].Name())
			}
		})
	}
}

// TestDemoReaderGone: fence demo | head: the reader goes away after the
// first line. fence must end within a few seconds and leave nothing in
// TMPDIR, in the embedded stories and in the failover ones. Before, the
// first write to the closed pipe killed it (SIGPIPE) on the spot, and its
// SQLite directory and its redis-server directories stayed in TMPDIR.
func TestDemoReaderGone(t *testing.T) {
	for _, at := range []string{"fence demo:", "Story 3:", "Story 5:"} {
		t.Run(at, func(t *testing.T) {
			tmp := t.TempDir()
			cmd := exec.Command(fenceBin, "demo")
			cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stdout = w
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			w.Close()
			sc := bufio.NewScanner(r)
			for sc.Scan() && !strings.Contains(sc.Text(), at) {
			}
			r.Close() // the reader goes away
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			select {
			case <-exited:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
				t.Fatal("fence demo went on for 20 s after its reader went away")
			}
			if left, _ := os.ReadDir(tmp); len(left) != 0 {
				t.Errorf("fence demo left %d entries in TMPDIR (exit %v), e.g. %s", len(left), cmd.ProcessState, left[0].Name())
			}
		})
	}
}
