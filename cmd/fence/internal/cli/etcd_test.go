package cli_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestExecOnEtcd: exec takes its lock from etcd with --etcd or
// FENCE_ETCD_ENDPOINTS, which the command does not inherit; a second exec
// of the same lock is refused while the first holds it; an unreachable
// cluster is a connection error within the dial timeout.
func TestExecOnEtcd(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	url := c.Members[0].ClientURL
	out, errOut, code := fence(t, nil, "exec", "--etcd", url, "lock:payment:1001", "--", "sh", "-c", `echo "$FENCE_TOKEN"`)
	first, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if code != 0 || err != nil || first <= 0 {
		t.Fatalf("exec --etcd: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// From the environment; the child sees neither the variable nor the
	// lock free: a nested exec of the same lock is refused (75), of
	// another lock granted a greater token.
	script := `env | grep -c FENCE_ETCD; "$0" exec --etcd "$1" lock:payment:1001 -- true; echo "held:$?"; "$0" exec --etcd "$1" other -- sh -c 'echo "$FENCE_TOKEN"'`
	out, errOut, code = fence(t, []string{"FENCE_ETCD_ENDPOINTS=" + url}, "exec", "lock:payment:1001", "--", "sh", "-c", script, fenceBin, url)
	lines := strings.Fields(out)
	if code != 0 || len(lines) != 3 || lines[0] != "0" || lines[1] != "held:"+strconv.Itoa(cli.ExitNotAcquired) {
		t.Fatalf("nested exec: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if tok, err := strconv.ParseInt(lines[2], 10, 64); err != nil || tok <= first {
		t.Fatalf("token of the nested exec %q, want > %d", lines[2], first)
	}
	// Two backends at once is a usage error.
	if _, errOut, code := fence(t, nil, "exec", "--etcd", url, "--redis-cluster", "redis://127.0.0.1:1", "n", "--", "true"); code != cli.ExitUsage || !strings.Contains(errOut, "--etcd") {
		t.Fatalf("--etcd with --redis-cluster: exit %d, %q", code, errOut)
	}
	c.Members[0].Kill()
	start := time.Now()
	_, errOut, code = fence(t, nil, "exec", "--etcd", url, "n", "--", "true")
	if code != cli.ExitUsage || time.Since(start) > 10*time.Second {
		t.Fatalf("exec with etcd down: exit %d after %v, %q", code, time.Since(start), errOut)
	}
}

// TestExecOnEtcdLeavesNoLease: exec released its lock and exited with the
// etcd Locker's spare lease (the released lock's etcd lease, kept for the
// next Acquire) and its background work left to die with the client: the
// etcd lease stayed on the cluster until its TTL ran out. exec closes the
// Locker before the client, so no etcd lease is left when it exits.
func TestExecOnEtcdLeavesNoLease(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t)
	url := c.Members[0].ClientURL
	if _, errOut, code := fence(t, nil, "exec", "--etcd", url, "lease-left", "--", "true"); code != 0 {
		t.Fatalf("exec --etcd: exit %d, stderr %q", code, errOut)
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	leases, err := admin.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 0 {
		t.Fatalf("%d etcd lease(s) left on the cluster after exec exited: %v", len(leases.Leases), leases.Leases)
	}
}
