package cli_test

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
)

// A URL flag mistyped (one dash, a wrong name) with its password in it:
// the usage error must not print the password. "-redis=redis://:pw@host"
// made pflag say "unknown shorthand flag: 'r' in -redis=redis://:pw@host",
// printed as it was: fence scrubbed only the values of the flags it knows,
// spelled right.
func TestMistypedURLFlagHidesPassword(t *testing.T) {
	t.Parallel()
	const secret = "supersecret"
	for _, args := range [][]string{
		{"status", "-redis=redis://:" + secret + "@127.0.0.1:1", "lock:x"},
		{"status", "-redis-sentinel=redis://u:" + secret + "@127.0.0.1:1?master_name=m", "lock:x"},
		{"doctor", "-redlock=redis://:" + secret + "@127.0.0.1:1,redis://:" + secret + "@127.0.0.1:2"},
		{"exec", "-etcd=http://root:" + secret + "@127.0.0.1:1", "lock:x", "--", "true"},
		{"exec", "--redis", "redis://127.0.0.1:1", "--wait=redis://:" + secret + "@h", "lock:x", "--", "true"},
	} {
		out, errOut, code := fence(t, nil, args...)
		if code != cli.ExitUsage || strings.Contains(out+errOut, secret) {
			t.Errorf("fence %q: exit %d, stdout %q, stderr %q; want exit %d without the password", args, code, out, errOut, cli.ExitUsage)
		}
	}
}
