package cli_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
)

// fence status against a server that accepts connections and never answers,
// named by each kind of Redis URL: it gives up with exit status 2 within its
// --timeout, as doctor does; without the flag, within the default (10 s).
// It took 40 s (--redis) and 25 s (--redis-sentinel) with no way to bound
// it: go-redis's read timeout, retried, for each command.
func TestStatusBlackHoleWithinTimeout(t *testing.T) {
	hole := blackHole(t)
	closed := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}()
	run := func(limit time.Duration, args ...string) {
		t.Helper()
		start := time.Now()
		out, errOut, code := fence(t, nil, append([]string{"status"}, args...)...)
		took := time.Since(start)
		if code != cli.ExitUsage || strings.Contains(errOut, "unknown flag") {
			t.Errorf("status %v on a black hole: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
		if took > limit {
			t.Errorf("status %v on a black hole took %v, want at most %v", args, took, limit)
		}
	}
	for _, args := range [][]string{
		{"--redis", "redis://" + hole},
		{"--json", "--redis", "redis://" + hole + "/0?read_timeout=30s"},
		{"--redis-sentinel", "redis://" + hole + "?master_name=mymaster"},
		{"--redis-cluster", "redis://" + hole + "?addr=" + closed},
	} {
		run(4*time.Second, append(append([]string{"--timeout", "1s"}, args...), "lock:x")...)
	}
	run(14*time.Second, "--redis", "redis://"+hole, "lock:x")
}
