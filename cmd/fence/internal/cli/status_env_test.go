package cli_test

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
)

// TestStatusWithAnotherBackendsVariable: with FENCE_ETCD_ENDPOINTS or
// FENCE_ZOOKEEPER_SERVERS set, fence exec takes its locks from etcd or
// ZooKeeper, but fence status reads only Redis (or Redlock): without a Redis
// flag on its command line it refuses, naming the variable, rather than
// report on a Redis lock (free, on a local Redis) that exec never took.
// Before, it read redis://127.0.0.1:6379.
func TestStatusWithAnotherBackendsVariable(t *testing.T) {
	t.Parallel()
	const closed = "redis://127.0.0.1:1"
	for _, env := range []string{"FENCE_ETCD_ENDPOINTS=http://127.0.0.1:1", "FENCE_ZOOKEEPER_SERVERS=127.0.0.1:1"} {
		name := env[:strings.Index(env, "=")]
		_, errOut, code := fence(t, []string{env, "FENCE_REDIS_URL=" + closed}, "status", "x")
		if code != cli.ExitUsage || !strings.Contains(errOut, name) {
			t.Errorf("%s fence status x: exit %d, stderr %q; want exit %d naming %s", env, code, errOut, cli.ExitUsage, name)
		}
		// Asked for a Redis on the command line, it reads that Redis.
		_, errOut, code = fence(t, []string{env}, "status", "--redis", closed, "x")
		if code != cli.ExitUsage || strings.Contains(errOut, name) {
			t.Errorf("%s fence status --redis %s x: exit %d, stderr %q; want a connection error", env, closed, code, errOut)
		}
	}
}
