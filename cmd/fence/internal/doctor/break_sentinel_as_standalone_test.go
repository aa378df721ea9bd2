package doctor_test

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/doctor"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A Sentinel's address given as a standalone primary (--redis instead of
// --redis-sentinel) is a usage mistake: the doctor must say so, not tell
// the user that EVAL, EVALSHA, WAIT and INFO are disabled or renamed and
// to "use a Redis where EVAL is enabled" (it misdiagnosed it so: four
// command-missing findings, config-unreadable and acl-unchecked, and
// nothing naming Sentinel).
func TestSentinelGivenAsStandalone(t *testing.T) {
	p := redistest.Start(t, durable...)
	ss := redistest.StartSentinels(t, p, 1)
	addr := ss.Addrs()[0]
	fs := run(t, doctor.Config{Standalone: &redis.Options{Addr: addr}})
	f := has(t, fs, "standalone-sentinel", doctor.Critical, addr)
	if !strings.Contains(f.Fix, "--redis-sentinel") {
		t.Fatalf("Fix does not name --redis-sentinel: %s", f.Fix)
	}
	lacks(t, fs, "command-missing")
	lacks(t, fs, "config-unreadable")
	lacks(t, fs, "acl-unchecked")
}
