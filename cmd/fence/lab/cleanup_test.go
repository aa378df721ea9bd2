package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestCleanupWhileAWorkerFails: cleanup kills the workers one by one and
// waits for each to exit; a worker that fails meanwhile, on its own, is
// noted as it exits (spawn). cleanup held the experiment's lock while it
// waited, so that note waited for cleanup, and cleanup, reaching that
// worker, waited for its exit forever: the lab hung in its deferred
// cleanup ("cleanup did not return within 15s"). Here the first worker's
// exit takes a while (a child of it keeps its stdout open), and the second
// fails in that while.
func TestCleanupWhileAWorkerFails(t *testing.T) {
	r := testResource(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// w1's child holds its stdout until the FIFO is opened for writing and
	// closed (release), so that w1 is not done however late cleanup runs.
	fifo := filepath.Join(t.TempDir(), "release")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	release := sync.OnceFunc(func() {
		if f, err := os.OpenFile(fifo, os.O_RDWR, 0); err == nil {
			_ = f.Close()
		}
	})
	t.Cleanup(release)
	x := &experiment{ctx: ctx, cfg: Config{Worker: []string{"sh", "-c", "(read line < " + fifo + ") & echo '{\"worker\":\"w1\",\"kind\":\"ready\"}'; exec sleep 60"}},
		res: r, hist: newHistory(), stop: make(chan struct{})}
	slow, err := x.spawn(Spec{ID: "w1", Key: "p"})
	if err != nil {
		t.Fatal(err)
	}
	// Killed before its child started, w1 would be done at once.
	if _, ok := x.waitEvent(func(e Event) bool { return e.Worker == "w1" && e.Kind == "ready" }, 10*time.Second); !ok {
		t.Fatal("w1 did not start its child within 10s")
	}
	x.cfg.Worker = []string{"sh", "-c", "read line; echo 'lab worker: lost the database' >&2; exit 3"}
	failing, err := x.spawn(Spec{ID: "w2", Key: "p"})
	if err != nil {
		t.Fatal(err)
	}
	cleaned := make(chan struct{})
	go func() { defer close(cleaned); x.cleanup() }()
	// cleanup has killed w1 (a zombie until its stdout closes) and waits
	// for it: w2 fails now.
	deadline := time.Now().Add(10 * time.Second)
	for !zombie(slow.cmd.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatal("w1 was not killed within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	failing.finish()
	// w2 has failed and been reaped (its note is then under way) before
	// w1 is let go.
	deadline = time.Now().Add(10 * time.Second)
	for !reaped(failing.cmd.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatal("w2 did not exit within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	release()
	select {
	case <-cleaned:
	case <-time.After(15 * time.Second):
		t.Fatal("cleanup did not return within 15s")
	}
}

// reaped reports whether process pid is gone, waited for by its parent.
func reaped(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return os.IsNotExist(err)
}

// zombie reports whether process pid has exited and is not reaped yet.
func zombie(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	b := string(raw)
	f := strings.Fields(b[strings.LastIndexByte(b, ')')+1:])
	return len(f) > 0 && f[0] == "Z"
}
