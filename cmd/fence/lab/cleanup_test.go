package lab

import (
	"context"
	"fmt"
	"os"
	"strings"
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
	x := &experiment{ctx: ctx, cfg: Config{Worker: []string{"sh", "-c", "sleep 3 & exec sleep 60"}},
		res: r, hist: newHistory(), stop: make(chan struct{})}
	slow, err := x.spawn(Spec{ID: "w1", Key: "p"})
	if err != nil {
		t.Fatal(err)
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
	select {
	case <-cleaned:
	case <-time.After(15 * time.Second):
		t.Fatal("cleanup did not return within 15s")
	}
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
