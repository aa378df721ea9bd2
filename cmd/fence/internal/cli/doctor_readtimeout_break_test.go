package cli_test

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
)

// TestDoctorShortReadTimeout: fence doctor on a reachable, durable primary
// named by a URL whose read_timeout (100 ms) leaves no room for replica
// sync's WAIT. While New refused such a client, the doctor said
// "deployment unreachable" (exit 2) and audited nothing. Now a Locker on it
// refuses every try that needs a WAIT: on a primary without replicas none
// does (exit 0, INFO no-replicas); once it has a replica, every exec with
// that URL exits 2, a critical finding. With --no-replica-sync the URL is
// fine.
func TestDoctorShortReadTimeout(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	url := redisURL(srv) + "?read_timeout=100ms"
	out, errOut, code := fence(t, nil, "doctor", "--redis", url)
	if code != 0 || strings.Contains(out, "read-timeout") || !strings.Contains(out, "no-replicas") {
		t.Errorf("doctor with read_timeout=100ms, no replica: exit %d, stdout %q, stderr %q; want 0 and no read-timeout finding",
			code, out, errOut)
	}
	redistest.StartReplica(t, srv, "--appendonly", "yes", "--appendfsync", "always")
	redistest.WaitReplicated(t, srv, 1)
	out, errOut, code = fence(t, nil, "doctor", "--redis", url)
	if code != cli.ExitDoctorCritical || !strings.Contains(out, "read-timeout") || strings.Contains(errOut, "unreachable") {
		t.Errorf("doctor with read_timeout=100ms and a replica: exit %d, stdout %q, stderr %q; want %d, a read-timeout finding and the rest of the audit",
			code, out, errOut, cli.ExitDoctorCritical)
	}
	out, errOut, code = fence(t, nil, "doctor", "--no-replica-sync", "--redis", url)
	if strings.Contains(out, "read-timeout") {
		t.Errorf("doctor --no-replica-sync with read_timeout=100ms: exit %d, stdout %q, stderr %q; want no read-timeout finding", code, out, errOut)
	}
}
