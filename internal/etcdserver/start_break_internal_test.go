package etcdserver

import (
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// The port check of commit a3ed942 tried again (branch break-today).

// TestMemberRestartOnTakenPort: a member of a 3-member cluster is killed,
// another test's etcd takes its client port, and the member is restarted
// (Restart keeps its ports) and waited for: WaitReady must fail with
// errPortTaken, and the cluster's own Restart too, within their limits.
func TestMemberRestartOnTakenPort(t *testing.T) {
	c, err := StartCluster(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := c.Members[1]
	m.Kill()
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	f := &Member{Name: "f0", ClientURL: m.ClientURL, PeerURL: peer, Dir: filepath.Join(t.TempDir(), "f0"), bin: m.bin}
	if err := f.writeConfig("f0="+peer, "another-cluster"); err != nil {
		t.Fatal(err)
	}
	if err := f.launch(); err != nil {
		t.Fatal(err)
	}
	defer f.Kill()
	if err := f.WaitReady(readyTimeout); err != nil {
		t.Fatal(err)
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	err = m.WaitReady(10 * time.Second)
	t.Logf("WaitReady after %v: %.300v", time.Since(began), err)
	if !errors.Is(err, errPortTaken) {
		t.Errorf("WaitReady of a member whose client port another cluster took = %v, want errPortTaken", err)
	}
	began = time.Now()
	err = c.Restart()
	t.Logf("Cluster.Restart after %v: %.300v", time.Since(began), err)
	if !errors.Is(err, errPortTaken) {
		t.Errorf("Cluster.Restart with a member's client port taken by another cluster = %v, want errPortTaken", err)
	}
	if err := f.WaitReady(5 * time.Second); err != nil {
		t.Errorf("the other cluster's member after all that: %v", err)
	}
}
