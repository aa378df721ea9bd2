package cli_test

import (
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
	closed := closedAddr(t)
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

// fence exec --wait 1s against a server that never answers: exit 2 (a
// connection error, not 75: nobody holds the lock) within --wait and a
// little more. It took 5 s with exit 2 by --redis, and 25 s with exit 75
// by --redis-sentinel: redislock's first try runs on exec's context, which
// has no deadline, not on the wait budget, so go-redis's own timeouts
// bound it; and go-redis's sentinel error wraps context.DeadlineExceeded,
// which exec maps to "not acquired within --wait".
func TestExecBlackHoleWithinWait(t *testing.T) {
	t.Skip("bug: exec on a hung Redis outlasts --wait: redislock's first try is bounded by the client's timeouts (and go-redis's Sentinel lookup), not the wait budget")
	hole := blackHole(t)
	for _, url := range [][]string{
		{"--redis", "redis://" + hole},
		{"--redis-sentinel", "redis://" + hole + "?master_name=mymaster"},
	} {
		start := time.Now()
		out, errOut, code := fence(t, nil, append(append([]string{"exec", "--wait", "1s"}, url...), "lock:x", "--", "true")...)
		took := time.Since(start)
		if code != cli.ExitUsage || took > 4*time.Second {
			t.Errorf("exec --wait 1s %v on a black hole: exit %d after %v, want %d within 4s; stdout %q, stderr %q",
				url, code, took, cli.ExitUsage, out, errOut)
		}
	}
}
