package doctor_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/doctor"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestClusterNodeTimeoutPerMaster: masters with differing
// cluster-node-timeout get the warning each by the timeouts of the masters
// that flag it (TestClusterNodeTimeoutIsTheOtherMasters), with the default
// lease time (Config's zero: 30 s): with one raised to it, the two others
// each need its flag and get none, and it gets one; and a doctor whose
// user is refused CONFIG GET reports
// config-unreadable, neither a cluster-node-timeout finding read from the
// missing settings nor a crash, and says that the timeout went unchecked.
func TestClusterNodeTimeoutPerMaster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	raised := cluster.Servers[0]
	if err := raised.Client(t).ConfigSet(context.Background(), "cluster-node-timeout", "30000").Err(); err != nil {
		t.Fatal(err)
	}
	fs := run(t, doctor.Config{Cluster: &redis.ClusterOptions{Addrs: cluster.Addrs()}})
	n := 0
	for _, f := range fs {
		if f.ID == "cluster-node-timeout" {
			n++
			if f.Node != raised.Addr {
				t.Fatalf("warning on a master whose failover needs the raised master's flag (30 s):\n%s", dump(fs))
			}
		}
	}
	if n != 1 {
		t.Fatalf("%d cluster-node-timeout findings, want one, on the raised master:\n%s", n, dump(fs))
	}

	for _, s := range cluster.Servers {
		if err := s.Client(t).Do(context.Background(), "ACL", "SETUSER", "doc", "on", ">pw", "~*", "&*", "+@all", "-config").Err(); err != nil {
			t.Fatal(err)
		}
	}
	fs = run(t, doctor.Config{Cluster: &redis.ClusterOptions{Addrs: cluster.Addrs(), Username: "doc", Password: "pw"}})
	lacks(t, fs, "cluster-node-timeout")
	f := has(t, fs, "config-unreadable", doctor.Warning, "")
	if !strings.Contains(f.Why+f.Fix, "cluster-node-timeout") {
		t.Errorf("config-unreadable does not say cluster-node-timeout went unchecked:\n  %s\n  %s", f.Why, f.Fix)
	}
}

// TestClusterNodeTimeoutIsTheOtherMasters: a master is failed over once a
// majority of the masters has flagged it, each after its own
// cluster-node-timeout; its own setting does not delay that. A master
// whose timeout was raised to the lease time, among masters at 2 s, is
// failed over about 2 s after it stops answering, and must get the
// warning; masters whose majority of flaggers is at the lease time get
// none, whatever their own setting.
func TestClusterNodeTimeoutIsTheOtherMasters(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	set := func(s *redistest.Server, ms string) {
		t.Helper()
		if err := s.Client(t).ConfigSet(context.Background(), "cluster-node-timeout", ms).Err(); err != nil {
			t.Fatal(err)
		}
	}
	cfg := doctor.Config{Cluster: &redis.ClusterOptions{Addrs: cluster.Addrs()}}
	set(cluster.Servers[0], "30000")
	has(t, run(t, cfg), "cluster-node-timeout", doctor.Warning, cluster.Servers[0].Addr)

	// Only master 0 at 2 s: each master needs two flags, one of them at
	// 30 s: no failover within the lease time.
	set(cluster.Servers[0], "2000")
	set(cluster.Servers[1], "30000")
	set(cluster.Servers[2], "30000")
	lacks(t, run(t, cfg), "cluster-node-timeout")
}
