package cli_test

import (
	"strings"
	"testing"
	"unicode"

	"github.com/fencekit/fence/internal/redistest"
)

// TestDoctorPrintsServerTextEscaped: fence doctor on a primary whose replica
// announces an address holding terminal escapes. The doctor cannot reach
// that replica and says so, naming the address; go-redis logs its failed
// dials too. Neither stdout nor stderr may carry the escapes as they are:
// on a terminal they would retitle the window, clear the screen or
// rewrite the findings printed above.
func TestDoctorPrintsServerTextEscaped(t *testing.T) {
	t.Parallel()
	durable := []string{"--appendonly", "yes", "--appendfsync", "always"}
	primary := redistest.Start(t, durable...)
	redistest.StartReplica(t, primary, append(durable, "--replica-announce-ip", "10.0.0.1\x1b]0;pwned\x07\x1b[2J\u009b31m")...)
	redistest.WaitReplicated(t, primary, 1)
	out, errOut, code := fence(t, nil, "doctor", "--timeout", "5s", "--redis", redisURL(primary))
	t.Logf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	if !strings.Contains(out, "pwned") {
		t.Fatalf("the doctor does not name the replica by its announced address; the test shows nothing (exit %d)", code)
	}
	for name, s := range map[string]string{"stdout": out, "stderr": errOut} {
		for _, r := range s {
			if r != '\n' && r != ' ' && !unicode.IsPrint(r) {
				t.Errorf("%s carries %U as it is", name, r)
				break
			}
		}
	}
}
