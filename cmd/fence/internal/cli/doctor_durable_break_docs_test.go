package cli_test

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/internal/redistest"
)

// TestDoctorDurablePrimaryNoFindings: the README's doctor section says that
// a primary with appendonly yes, appendfsync always, noeviction and
// min-replicas-to-write 1, and one replica in sync with appendonly yes and
// appendfsync always, "prints fence doctor: no findings and exits 0".
func TestDoctorDurablePrimaryNoFindings(t *testing.T) {
	t.Parallel()
	durable := []string{"--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction"}
	primary := redistest.Start(t, append(durable, "--min-replicas-to-write", "1")...)
	redistest.StartReplica(t, primary, durable...)
	redistest.WaitReplicated(t, primary, 1)
	out, errOut, code := fence(t, nil, "doctor", "--redis", redisURL(primary))
	if code != 0 || !strings.Contains(out, "no findings") || errOut != "" {
		t.Fatalf("doctor on the README's durable primary and replica: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
