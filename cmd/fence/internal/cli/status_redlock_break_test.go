package cli_test

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
)

// fence status given both --redis (on the command line) and Redlock's
// masters (--redlock, or FENCE_REDLOCK_URLS): exit 2, as fence exec and
// fence doctor refuse the pair. It read the Redlock masters and said
// nothing of --redis: "free" for a lock that fence exec --redis held on
// the Redis the user named.
func TestStatusRedisAndRedlock(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var masters []string
	for range 3 {
		masters = append(masters, redisURL(redistest.Start(t)))
	}
	urls := strings.Join(masters, ",")
	for _, c := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{"status", "--redlock", urls, "--redis", redisURL(srv), "lock:x"}},
		{[]string{"FENCE_REDLOCK_URLS=" + urls}, []string{"status", "--redis", redisURL(srv), "lock:x"}},
		// An empty --redlock ("$URLS" unset) is refused too, as by exec
		// and doctor, rather than read as no Redlock (the default Redis).
		{[]string{"FENCE_REDIS_URL=" + redisURL(srv)}, []string{"status", "--redlock", "", "lock:x"}},
	} {
		out, errOut, code := fence(t, c.env, c.args...)
		if code != cli.ExitUsage {
			t.Errorf("fence %q with %q: exit %d, stdout %q, stderr %q; want exit %d refusing two lock services", c.args, c.env, code, out, errOut, cli.ExitUsage)
		}
	}
}
