package cli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
)

// TestExecShortWaitLaggingReplica: a free lock on a primary whose one
// replica lags (paused). The first try is answered: the script, then WAIT
// for the replica, which Redis times out after the sync timeout (1 s) and
// answers up to a clock tick later with 0 acknowledgements. That is
// fence.ErrNotReplicated, exit 75, whatever --wait is: Redis answered, and
// too few replicas confirmed the lock. exec's Acquire context, which ends
// 1 s after --wait, must not cut that answer off into exit 2 ("no answer
// from Redis").
func TestExecShortWaitLaggingReplica(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	replica.Pause(t)
	for _, wait := range []string{"1ms", "50ms", "100ms", "1s"} {
		st := time.Now()
		out, errOut, code := fence(t, nil, "exec", "--redis", redisURL(primary), "--wait", wait, "lock:lag-"+wait, "--", "echo", "ran")
		if code != cli.ExitNotAcquired || !strings.Contains(errOut, "replica") {
			t.Errorf("exec --wait %s, replica lagging: exit %d after %v, stdout %q, stderr %q; want %d (too few replicas confirmed)",
				wait, code, time.Since(st), out, errOut, cli.ExitNotAcquired)
		} else {
			t.Logf("exec --wait %s, replica lagging: exit %d after %v: %s", wait, code, time.Since(st), strings.TrimSpace(errOut))
		}
	}
}
