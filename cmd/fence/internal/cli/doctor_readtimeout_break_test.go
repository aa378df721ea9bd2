package cli_test

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
)

// TestDoctorShortReadTimeout: fence doctor on a reachable, durable primary
// named by a URL whose read_timeout (100 ms) redislock.New refuses with
// replica sync on (no WAIT fits in it). The doctor must audit the
// deployment and say what is wrong, critical since fence exec and status
// with that URL exit 2; it said "deployment unreachable" (exit 2) and
// audited nothing. Before the refusal landed it audited the server (exit 0,
// INFO no-replicas). With --no-replica-sync the URL is fine.
func TestDoctorShortReadTimeout(t *testing.T) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	url := redisURL(srv) + "?read_timeout=100ms"
	out, errOut, code := fence(t, nil, "doctor", "--redis", url)
	if code != cli.ExitDoctorCritical || !strings.Contains(out, "read-timeout") || !strings.Contains(out, "no-replicas") || strings.Contains(errOut, "unreachable") {
		t.Errorf("doctor with read_timeout=100ms: exit %d, stdout %q, stderr %q; want %d, a read-timeout finding and the rest of the audit",
			code, out, errOut, cli.ExitDoctorCritical)
	}
	out, errOut, code = fence(t, nil, "doctor", "--no-replica-sync", "--redis", url)
	if code != 0 || strings.Contains(out, "read-timeout") {
		t.Errorf("doctor --no-replica-sync with read_timeout=100ms: exit %d, stdout %q, stderr %q; want 0", code, out, errOut)
	}
}
