package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fencekit/fence/internal/redistest"
)

// TestStatusJSONHeldWithoutExpiry: a lock key held without expiry (set by
// hand, or by a client that is not fence) is "held, without expiry" in
// fence status's text, and ttl_ms -1 in its --json, as Redis's PTTL says
// it. Before, the JSON said ttl_ms 0: a lock about to be free, for one that
// never will be (a script that waits for ttl_ms to run out spins on it).
// The same for --redlock's per-node JSON.
func TestStatusJSONHeldWithoutExpiry(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	if err := srv.Client(t).Set(context.Background(), "fence:{lock:stuck}", "someone", 0).Err(); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := fence(t, nil, "status", "--redis", redisURL(srv), "lock:stuck")
	if code != 0 || !strings.Contains(out, "held, without expiry") {
		t.Fatalf("status: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = fence(t, nil, "status", "--json", "--redis", redisURL(srv), "lock:stuck")
	var s struct {
		Held  bool  `json:"held"`
		TTLms int64 `json:"ttl_ms"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &s) != nil || !s.Held || s.TTLms != -1 {
		t.Fatalf("status --json: exit %d, stdout %q, stderr %q; want held with ttl_ms -1", code, out, errOut)
	}

	if err := srv.Client(t).Set(context.Background(), "redlock:{lock:stuck}", "someone", 0).Err(); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = fence(t, nil, "status", "--json", "--redlock", redisURL(srv), "lock:stuck")
	var r struct {
		Nodes []struct {
			Held  bool  `json:"held"`
			TTLms int64 `json:"ttl_ms"`
		} `json:"nodes"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil || len(r.Nodes) != 1 || !r.Nodes[0].Held || r.Nodes[0].TTLms != -1 {
		t.Fatalf("status --json --redlock: exit %d, stdout %q, stderr %q; want its node held with ttl_ms -1", code, out, errOut)
	}
}
