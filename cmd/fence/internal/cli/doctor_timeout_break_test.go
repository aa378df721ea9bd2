package cli_test

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
)

// fence doctor --timeout 0 (or negative) on a Redis that answers: a usage
// error naming the flag, as fence status gives, not a claim that the
// deployment is unreachable. It said "doctor: deployment unreachable:
// ...: INFO: context deadline exceeded" of a healthy local Redis.
func TestDoctorNonPositiveTimeout(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, d := range []string{"0", "-1s"} {
		out, errOut, code := fence(t, nil, "doctor", "--no-replica-sync", "--redis", redisURL(srv), "--timeout", d)
		if code != cli.ExitUsage || !strings.Contains(errOut, "--timeout") || strings.Contains(errOut, "unreachable") {
			t.Errorf("doctor --timeout %s on a live Redis: exit %d, stdout %q, stderr %q; want exit %d naming --timeout", d, code, out, errOut, cli.ExitUsage)
		}
	}
}
