package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/fencekit/fence/internal/redistest"
)

// TestStatusRedlockJSONTooFewReached: fence status --redlock exits 2 when
// fewer nodes than a quorum are read, as its help says, with --json too. Two
// of three URLs name replicas (a deployment after failovers), where the
// nodes' read answers READONLY: one node read, quorum 2. The text exited
// 2, but --json exited 0 with held_on 0, which a script reads as a free
// lock ("exit 0" before the fix).
func TestStatusRedlockJSONTooFewReached(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t)
	r1 := redistest.StartReplica(t, primary)
	r2 := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 2)
	urls := strings.Join([]string{redisURL(primary), redisURL(r1), redisURL(r2)}, ",")
	out, errOut, code := fence(t, nil, "status", "--redlock", urls, "job")
	if code != 2 || !strings.Contains(out, "3 reached, 1 read") || !strings.Contains(out, "READONLY") {
		t.Errorf("status --redlock: exit %d, stdout %q, stderr %q; want exit 2, 3 reached, 1 read, READONLY", code, out, errOut)
	}
	out, errOut, code = fence(t, nil, "status", "--json", "--redlock", urls, "job")
	var r struct {
		Read   int `json:"read"`
		Quorum int `json:"quorum"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Read != 1 || r.Quorum != 2 {
		t.Errorf("status --json --redlock: stdout %q (%v); want read 1 of quorum 2", out, err)
	}
	if code != 2 {
		t.Errorf("status --json --redlock with 1 node read of quorum 2: exit %d, stderr %q; want 2", code, errOut)
	}
}
