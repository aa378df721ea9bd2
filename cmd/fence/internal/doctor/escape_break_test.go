package doctor_test

import (
	"strings"
	"testing"
	"unicode"

	"github.com/fencekit/fence/internal/redistest"
)

// TestServerTextCannotReachTheTerminal: a replica announces an address
// holding terminal escapes (replica-announce-ip is any string the replica's
// operator, or whoever controls it, sets; the primary lists it as is). The
// doctor reports that replica, unreachable, by that address: every field of
// a finding, which fence doctor prints to a terminal, must show such
// characters escaped, never as they are (an ESC sequence can retitle the
// window, hide lines or rewrite what was printed above it).
func TestServerTextCannotReachTheTerminal(t *testing.T) {
	primary := redistest.Start(t, durable...)
	const hostile = "10.0.0.1\x1b]0;pwned\x07\x1b[2J\u009b31m"
	redistest.StartReplica(t, primary, append(durable, "--replica-announce-ip", hostile)...)
	redistest.WaitReplicated(t, primary, 1)
	fs := run(t, standalone(primary))
	seen := false
	for _, f := range fs {
		for _, s := range []string{f.ID, f.Node, f.Why, f.Fix} {
			if strings.Contains(s, "pwned") {
				seen = true
			}
			for _, r := range s {
				if !unicode.IsPrint(r) && r != ' ' {
					t.Errorf("finding %s carries %U unescaped: %q", f.ID, r, s)
					break
				}
			}
		}
	}
	if !seen {
		t.Fatalf("no finding names the replica by its announced address; the test shows nothing:\n%s", dump(fs))
	}
}
