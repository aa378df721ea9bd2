// Package etcdtest starts real etcd servers for tests: each member on free
// loopback ports, in a temp dir, stopped in t.Cleanup and killed with the
// test binary if that dies first. It wraps internal/etcdserver, which code
// outside tests uses instead, so as not to link testing. It imports no etcd
// client, so that the root module's go.mod stays lean; a test makes its
// client from Cluster.Endpoints.
package etcdtest

import (
	"testing"
	"time"

	"github.com/fencekit/fence/internal/etcdserver"
)

// Start runs a standalone etcd server and stops it in t.Cleanup. A failure
// to build or start it fails the test with the step that fixes it.
func Start(t testing.TB) *etcdserver.Cluster {
	t.Helper()
	return StartCluster(t, 1)
}

// StartCluster runs an etcd cluster of n members, waits until every member
// serves, and stops them in t.Cleanup.
func StartCluster(t testing.TB, n int) *etcdserver.Cluster {
	t.Helper()
	c, err := etcdserver.StartCluster(t.TempDir(), n)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// Leader returns the cluster's leader, waiting up to 10 s for one, and
// ignoring the members in except.
func Leader(t testing.TB, c *etcdserver.Cluster, except ...*etcdserver.Member) *etcdserver.Member {
	t.Helper()
	m, err := c.Leader(10*time.Second, except...)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	return m
}

// Restart kills every member and starts them again from their data dirs.
func Restart(t testing.TB, c *etcdserver.Cluster) {
	t.Helper()
	if err := c.Restart(); err != nil {
		t.Fatalf("etcdtest: restart: %v", err)
	}
}
