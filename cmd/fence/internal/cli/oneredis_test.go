package cli_test

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
)

// TestRedisAndSentinelOrCluster: --redis on the command line together with
// a Sentinel or Cluster URL (a flag, or its environment variable) is a usage
// error naming both. Before, the Sentinel or Cluster URL silently won, so
// fence exec --redis redis://a --redis-cluster redis://b took its lock on b,
// not on the Redis it was told to use.
func TestRedisAndSentinelOrCluster(t *testing.T) {
	t.Parallel()
	const closed = "redis://127.0.0.1:1" // nothing listens on port 1
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"exec", "--redis", closed, "--redis-cluster", closed, "x", "--", "true"}, "not --redis and --redis-cluster"},
		{nil, []string{"status", "--redis", closed, "--redis-sentinel", closed + "?master_name=m", "x"}, "not --redis and --redis-sentinel"},
		{[]string{"FENCE_REDIS_CLUSTER_URL=" + closed}, []string{"status", "--redis", closed, "x"}, "not --redis and FENCE_REDIS_CLUSTER_URL"},
		{[]string{"FENCE_REDIS_SENTINEL_URL=" + closed + "?master_name=m"}, []string{"doctor", "--redis", closed}, "not --redis and FENCE_REDIS_SENTINEL_URL"},
	} {
		_, errOut, code := fence(t, c.env, c.args...)
		if code != cli.ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v fence %v: exit %d, stderr %q; want exit %d naming %q", c.env, c.args, code, errOut, cli.ExitUsage, c.want)
		}
	}
}
