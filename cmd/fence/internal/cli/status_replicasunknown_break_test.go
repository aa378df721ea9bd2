package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/fencekit/fence/internal/redistest"
)

// TestStatusReplicasUnknown: when the lock is read but its primary's
// replica counts are not (here a replica record fence did not write, which
// refuses acquisitions), fence status says the counts are unknown and why,
// and still gives the lock's state. Before, it printed "replicas 0
// expected, 0 connected" (--json: replicas_expected 0), a claim that the
// primary has no replicas, and nothing of the record refusing every
// acquisition.
func TestStatusReplicasUnknown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	if err := admin.Set(context.Background(), "fence:replicas", "abc", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Set(context.Background(), "fence:{lock:counts}:token", "42", 0).Err(); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := fence(t, nil, "status", "--redis", redisURL(srv), "lock:counts")
	if code != 0 || !strings.Contains(out, "lock:counts: free; last token 42; replicas unknown: ") || !strings.Contains(out, "bad replica record fence:replicas") {
		t.Fatalf("status: exit %d, stdout %q, stderr %q; want free, token 42, replicas unknown naming the record", code, out, errOut)
	}
	out, errOut, code = fence(t, nil, "status", "--json", "--redis", redisURL(srv), "lock:counts")
	var s map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &s) != nil || s["last_token"] != float64(42) ||
		s["replicas_expected"] != nil || s["replicas_connected"] != nil ||
		!strings.Contains(fmt.Sprint(s["replicas_error"]), "bad replica record fence:replicas") {
		t.Fatalf("status --json: exit %d, stdout %q, stderr %q; want last_token 42, replicas_expected and replicas_connected null, replicas_error naming the record", code, out, errOut)
	}
}
