package cli_test

import (
	"bytes"
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redistest"
)

// TestExecUSR1WhileAcquiringLeavesNoLock: SIGUSR1 (a reload, a log
// rotation's postrotate sent to the service's main pid, which is fence)
// while fence exec waits for its acquisition's reply, the acquisition
// having run on Redis. exec passes SIGUSR1 and SIGUSR2 to the command once
// it runs; before that they ended fence by Go's default, as SIGHUP did
// (TestExecHangupAcquireLeavesNoLock): a death by signal, and the lock its
// acquisition took stayed held for a lease time with nobody holding it.
// With no command yet to pass it to, the signal must not end fence.
func TestExecUSR1WhileAcquiringLeavesNoLock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	if out, errOut, code := fence(t, nil, "exec", "--no-replica-sync", "--redis", redisURL(srv), "lock:warm", "--", "true"); code != 0 {
		t.Fatalf("warm-up exec: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	addr, held := replyHoldingProxy(t, srv.Addr, "eval")
	cmd := exec.Command(fenceBin, "exec", "--no-replica-sync", "--wait", "1s", "--redis", "redis://"+addr, "lock:usr1", "--", "true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("fence never sent its acquisition; stderr %q", stderr.String())
	}
	rdb := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waitKey(ctx, t, rdb, "fence:{lock:usr1}")
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	t.Logf("fence: %v; stderr %q", cmd.ProcessState, stderr.String())
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Errorf("SIGUSR1 before the command started ended fence: %v; stderr %q", cmd.ProcessState, stderr.String())
	}
	if pttl := rdb.PTTL(ctx, "fence:{lock:usr1}").Val(); pttl > 0 {
		t.Errorf("after fence exited (%v) the lock it was taking is still held for %v; stderr %q", cmd.ProcessState, pttl, stderr.String())
	}
}
