package cli_test

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/internal/redistest"
)

// `fence doctor --redis-cluster` at the default --watchdog-ttl (30 s)
// warns of the launcher's cluster-node-timeout (2 s) on every master, and
// with --watchdog-ttl within it, on none.
func TestDoctorClusterNodeTimeoutFlags(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	ca := cluster.Addrs()
	url := "redis://" + ca[0] + "?addr=" + ca[1] + "&addr=" + ca[2]
	out, errOut, code := fence(t, nil, "doctor", "--timeout", "5s", "--redis-cluster", url)
	if n := strings.Count(out, "cluster-node-timeout  "); n != 3 || code == 0 {
		t.Errorf("doctor --redis-cluster at the default lease time: exit %d, %d cluster-node-timeout findings, want 3; stdout %q, stderr %q", code, n, out, errOut)
	}
	out, errOut, _ = fence(t, nil, "doctor", "--timeout", "5s", "--watchdog-ttl", "2s", "--redis-cluster", url)
	if strings.Contains(out, "cluster-node-timeout  ") {
		t.Errorf("doctor --redis-cluster --watchdog-ttl 2s: stdout %q, stderr %q; want no cluster-node-timeout finding", out, errOut)
	}
}
