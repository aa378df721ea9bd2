package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencekit/fence/internal/redistest"
)

// TestExecCommandCannotStart: a command that is a directory, a file
// without the execute bit, an empty name, or a name not on PATH exits 127
// with a message naming it, and leaves the lock free.
func TestExecCommandCannotStart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	noexec := filepath.Join(dir, "script")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\ntrue\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, command := range []string{dir, noexec, "", "no-such-command-fence-test"} {
		_, errOut, code := fence(t, nil, "exec", "--redis", redisURL(srv), "start", "--", command)
		if code != 127 || (command != "" && !strings.Contains(errOut, command)) {
			t.Errorf("fence exec -- %q: exit %d, stderr %q; want 127 naming it", command, code, errOut)
		}
		if n := srv.Client(t).Exists(context.Background(), "fence:{start}").Val(); n != 0 {
			t.Errorf("fence exec -- %q: the lock is still held", command)
		}
	}
}

// TestExecTokenOverridesInherited: FENCE_TOKEN and FENCE_LOCK already set
// in fence's environment (a fence exec inside another) are replaced, not
// duplicated, in the command's: it sees this acquisition's.
func TestExecTokenOverridesInherited(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	out, errOut, code := fence(t, []string{"FENCE_TOKEN=1", "FENCE_LOCK=outer"}, "exec", "--redis", redisURL(srv), "inner", "--",
		"sh", "-c", `echo "$FENCE_LOCK $FENCE_TOKEN"; env | grep -c '^FENCE_TOKEN='`)
	f := strings.Fields(out)
	if code != 0 || len(f) != 3 || f[0] != "inner" || f[1] == "1" || f[2] != "1" {
		t.Fatalf("exit %d, stdout %q (want inner, a fresh token, one FENCE_TOKEN), stderr %q", code, out, errOut)
	}
}
