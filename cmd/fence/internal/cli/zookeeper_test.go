package cli_test

import (
	"bytes"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/zkserver"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

// fence exec --zookeeper takes the lock from ZooKeeper: the token is the
// lock node's creation zxid, greater each time; the servers may come from
// FENCE_ZOOKEEPER_SERVERS; a held lock gives up with 75 after --wait; a
// dead server is a connection error (2); two lock services are a usage
// error.
func TestExecZooKeeper(t *testing.T) {
	t.Parallel()
	srv, err := zkserver.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	token := func(env []string, args ...string) int64 {
		t.Helper()
		out, errOut, code := fence(t, env, append(append([]string{"exec"}, args...), "lock:zk", "--", "sh", "-c", `echo "$FENCE_TOKEN"`)...)
		tok, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
		if code != 0 || err != nil || tok <= 0 {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
		return tok
	}
	first := token(nil, "--zookeeper", srv.Addr, "--zookeeper-session-timeout", "2s")
	second := token([]string{"FENCE_ZOOKEEPER_SERVERS=" + srv.Addr + ",127.0.0.1:1"}, "--ttl", "5s")
	if second <= first {
		t.Fatalf("second token %d, want > %d", second, first)
	}

	dir := t.TempDir()
	holder := exec.Command(fenceBin, "exec", "--zookeeper", srv.Addr, "lock:zk", "--", "sh", "-c", "touch "+dir+"/started; cat >/dev/null")
	stdin, _ := holder.StdinPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, dir+"/started")
	start := time.Now()
	_, errOut, code := fence(t, nil, "exec", "--zookeeper", srv.Addr, "--wait", "300ms", "lock:zk", "--", "true")
	if code != cli.ExitNotAcquired || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("second exec: exit %d after %v (%s), want %d after the wait", code, time.Since(start), errOut, cli.ExitNotAcquired)
	}
	stdin.Close()
	if err := holder.Wait(); err != nil {
		t.Fatalf("holder: %v", err)
	}
	if third := token(nil, "--zookeeper", srv.Addr); third <= second {
		t.Fatalf("token after the holder %d, want > %d", third, second)
	}

	start = time.Now()
	if _, errOut, code := fence(t, nil, "exec", "--zookeeper", "127.0.0.1:1", "--zookeeper-session-timeout", "1s", "n", "--", "true"); code != cli.ExitUsage || !strings.Contains(errOut, "no session") {
		t.Errorf("dead server: exit %d (%s), want %d", code, errOut, cli.ExitUsage)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("dead server: exit after %v", took)
	}
	if _, errOut, code := fence(t, nil, "exec", "--zookeeper", ",", "n", "--", "true"); code != cli.ExitUsage || errOut == "" {
		t.Errorf("--zookeeper ,: exit %d (%s), want %d", code, errOut, cli.ExitUsage)
	}
}

// A lock node deleted behind fence exec's back (as an operator might)
// ends the lease: the watch on the node fires, the child is stopped and
// exec exits 76, at once rather than after a session timeout.
func TestExecZooKeeperLostLease(t *testing.T) {
	t.Parallel()
	srv, err := zkserver.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	cmd := exec.Command(fenceBin, "exec", "--zookeeper", srv.Addr, "--grace", "200ms", "doomed", "--", "sh", "-c", "touch "+dir+"/started; sleep 60")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	waitFile(t, dir+"/started")
	conn, _, err := zk.Connect([]string{srv.Addr}, 5*time.Second, zk.WithLogger(quietLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lockDir := zklock.DefaultRoot + "/doomed"
	nodes, _, err := conn.Children(lockDir)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("children of %s: %v, %v", lockDir, nodes, err)
	}
	deleted := time.Now()
	if err := conn.Delete(lockDir+"/"+nodes[0], -1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		t.Fatal("fence exec still running a minute after its lock node was deleted")
	}
	if code := cmd.ProcessState.ExitCode(); code != cli.ExitLeaseLost {
		t.Fatalf("exit %d, want %d; stderr: %s", code, cli.ExitLeaseLost, stderr.String())
	}
	if took := time.Since(deleted); took > 3*time.Second {
		t.Fatalf("child stopped %v after the node was deleted", took)
	}
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// TestZookeeperChrootRefused: a ZooKeeper connect string may end in a
// chroot ("host:2181/app", as zkCli.sh takes it), which go-zookeeper does
// not support: it never connected, and exec failed only after the session
// timeout with "no session". It is a usage error at once, pointing at
// --zookeeper-root.
func TestZookeeperChrootRefused(t *testing.T) {
	t.Parallel()
	for _, servers := range []string{"127.0.0.1:2181/app", "127.0.0.1:2181,127.0.0.1:2182/app"} {
		start := time.Now()
		_, errOut, code := fence(t, nil, "exec", "--zookeeper", servers, "--zookeeper-session-timeout", "30s", "job", "--", "true")
		if code != cli.ExitUsage || !strings.Contains(errOut, "--zookeeper-root") || time.Since(start) > 15*time.Second {
			t.Errorf("--zookeeper %s: exit %d after %v, stderr %q; want exit %d at once naming --zookeeper-root",
				servers, code, time.Since(start).Round(time.Millisecond), errOut, cli.ExitUsage)
		}
	}
}
