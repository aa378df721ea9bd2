package redisserver

import "testing"

// A sentinel lists a replica as soon as the primary's INFO names it, before
// it has connected to the replica: flagged disconnected, its link not yet
// known. Such a replica is not ready (doctor's TestSentinelReplicaDown once
// saw it so, and reported it down on a healthy deployment).
func TestSettledReplicas(t *testing.T) {
	for _, c := range []struct {
		flags, link string
		want        int
	}{
		{"slave", "ok", 1},
		{"slave,disconnected", "err", 0},
		{"slave,disconnected", "ok", 0},
		{"slave", "err", 0},
		{"s_down,slave", "ok", 0},
		{"o_down,slave", "ok", 0},
	} {
		r := []map[string]string{{"flags": c.flags, "master-link-status": c.link}}
		if got := settledReplicas(r); got != c.want {
			t.Errorf("settledReplicas(flags %q, link %q) = %d, want %d", c.flags, c.link, got, c.want)
		}
	}
}
