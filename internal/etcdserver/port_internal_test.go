package etcdserver

import (
	"errors"
	"path/filepath"
	"strconv"
	"testing"
)

// Two members started at once may be handed the same free client port: the
// second fails to bind and exits, but the first serves on that port before
// it does. waitReady must never take the other cluster's member for its
// own (its test would share the other test's keys): it fails, and
// StartCluster tries other ports.
func TestStartOnTakenPortFails(t *testing.T) {
	taken, err := Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	m := &Member{Name: "m0", ClientURL: taken.Members[0].ClientURL, PeerURL: peer,
		Dir: filepath.Join(t.TempDir(), "m0"), bin: taken.Members[0].bin}
	if err := m.writeConfig("m0="+peer, "another"); err != nil {
		t.Fatal(err)
	}
	if err := m.launch(); err != nil {
		t.Fatal(err)
	}
	defer m.Kill()
	if err := (&Cluster{Members: []*Member{m}}).waitReady(); !errors.Is(err, errPortTaken) {
		t.Fatalf("waitReady on %s, where another cluster's member serves = %v, want errPortTaken", m.ClientURL, err)
	}
}
