//go:build linux

package cli_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
)

// TestExecPausedServerEndsChild: the Redis server is stopped (SIGSTOP)
// while the command runs, so the watchdog's renewals get no answer. The
// lease must end by its own deadline (--watchdog-ttl after the last
// renewal was sent), the command must get SIGTERM then, not after
// go-redis's timeouts, and exec must exit 76 within a bound, not hang on
// the paused server's release.
func TestExecPausedServerEndsChild(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const ttl = time.Second
	dir := t.TempDir()
	script := `trap 'touch D/term; exit 3' TERM; touch D/started; while :; do sleep 0.05; done`
	// read_timeout=30s: had exec waited for go-redis's timeouts, SIGTERM
	// would come 30 s late, far past the bound below, which can so leave
	// a loaded machine slack.
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv)+"/0?read_timeout=30s", "--watchdog-ttl", ttl.String(), "--grace", "5s", "paused", "--",
		"sh", "-c", strings.ReplaceAll(script, "D/", dir+"/"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, filepath.Join(dir, "started"))
	resume := srv.Pause(t)
	defer resume()
	paused := time.Now()
	waitFile(t, filepath.Join(dir, "term"))
	took := time.Since(paused)
	t.Logf("SIGTERM %v after the server was paused (--watchdog-ttl %v)", took, ttl)
	if limit := ttl + 10*time.Second; took > limit {
		t.Errorf("the command got SIGTERM %v after the server was paused, want under %v", took, limit)
	}
	runUntil(t, cmd, 30*time.Second)
	exitedAfter := time.Since(paused)
	t.Logf("fence exited %v after the pause; stderr: %s", exitedAfter, stderr.String())
	if code := cmd.ProcessState.ExitCode(); code != cli.ExitLeaseLost {
		t.Errorf("exit %d, want %d; stderr: %s", code, cli.ExitLeaseLost, stderr.String())
	}
}
