package cli_test

import (
	"bytes"
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
)

// TestExecHangupAcquireLeavesNoLock: SIGHUP (the terminal or the ssh
// session closed) while fence exec waits for its acquisition's reply, the
// acquisition having run on Redis. SIGHUP is passed to the command once it
// runs; before that it ended fence by Go's default: a death by signal, not
// exit 130, and the lock its acquisition took stayed held for a lease time
// (30 s) with nobody holding it. Now it is an interruption like SIGINT.
func TestExecHangupAcquireLeavesNoLock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	if out, errOut, code := fence(t, nil, "exec", "--no-replica-sync", "--redis", redisURL(srv), "lock:warm", "--", "true"); code != 0 {
		t.Fatalf("warm-up exec: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	addr, held := replyHoldingProxy(t, srv.Addr, "eval")
	cmd := exec.Command(fenceBin, "exec", "--no-replica-sync", "--wait", "5s", "--redis", "redis://"+addr, "lock:hup", "--", "true")
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waitKey(ctx, t, rdb, "fence:{lock:hup}")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != cli.ExitInterrupted {
		t.Errorf("after SIGHUP: %v, want exit %d; stderr %q", cmd.ProcessState, cli.ExitInterrupted, stderr.String())
	}
	if pttl := rdb.PTTL(ctx, "fence:{lock:hup}").Val(); pttl > 0 {
		t.Errorf("after SIGHUP the lock fence was taking is still held for %v", pttl)
	}
}
