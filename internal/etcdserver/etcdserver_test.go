package etcdserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/etcdserver"
)

// put writes a key through etcd's JSON gateway and returns the revision.
func put(t *testing.T, url string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v3/kv/put", strings.NewReader(`{"key":"a2V5","value":"dg=="}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("put: %v", err)
	}
	defer resp.Body.Close()
	var out struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("put: %v", err)
	}
	rev, err := strconv.ParseInt(out.Header.Revision, 10, 64)
	if err != nil {
		t.Fatalf("put: revision %q: %v", out.Header.Revision, err)
	}
	return rev
}

func TestStandalone(t *testing.T) {
	start := time.Now()
	c, err := etcdserver.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("standalone ready in %v", time.Since(start))
	m := c.Members[0]
	r1 := put(t, m.ClientURL)
	// Restart from the data dir: the revision goes on.
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	if r2 := put(t, m.ClientURL); r2 <= r1 {
		t.Fatalf("revision after restart %d, want > %d", r2, r1)
	}
	// Paused, it does not answer; continued, it does.
	m.Stop()
	if err := m.WaitReady(300 * time.Millisecond); err == nil {
		t.Fatal("a stopped member answered /health")
	}
	m.Cont()
	if err := m.WaitReady(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestClusterFailover(t *testing.T) {
	start := time.Now()
	c, err := etcdserver.StartCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("3 members ready in %v", time.Since(start))
	old, err := c.Leader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var other *etcdserver.Member
	for _, m := range c.Members {
		if m != old {
			other = m
		}
	}
	r1 := put(t, other.ClientURL)
	killed := time.Now()
	old.Kill()
	leader, err := c.Leader(10*time.Second, old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("new leader %s %v after the old one was killed", leader.Name, time.Since(killed))
	if leader == old {
		t.Fatal("the killed member is still the leader")
	}
	if r2 := put(t, leader.ClientURL); r2 <= r1 {
		t.Fatalf("revision after failover %d, want > %d", r2, r1)
	}
	if err := old.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := old.WaitReady(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	// The whole cluster restarts from its data dirs.
	r3 := put(t, old.ClientURL)
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	if r4 := put(t, c.Members[0].ClientURL); r4 <= r3 {
		t.Fatalf("revision after cluster restart %d, want > %d", r4, r3)
	}
}
