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
// cluster-node-timeout get the warning each on its own (the one raised to
// the lease time gets none), with the default lease time (Config's zero:
// 30 s); and a doctor whose user is refused CONFIG GET reports
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
			if f.Node == raised.Addr {
				t.Fatalf("warning on the master whose timeout is the lease time:\n%s", dump(fs))
			}
		}
	}
	if n != 2 {
		t.Fatalf("%d cluster-node-timeout findings, want one on each of the 2 other masters:\n%s", n, dump(fs))
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
