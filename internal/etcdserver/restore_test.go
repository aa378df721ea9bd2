package etcdserver_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/etcdserver"
)

// TestRestoreFromBadSnapshotLeavesMember: a Restore whose snapshot cannot
// be restored (no such file; a file that is no snapshot) returns an error
// and leaves the member as it was, serving, its data and revision kept: a
// test that gets the path wrong must not lose the member it restores.
//
// It failed: Restore killed the member and removed its data dir before
// etcdmain restore read the snapshot, and returned the error with the
// member dead ("Running() = false after a failed Restore") and its data
// gone.
func TestRestoreFromBadSnapshotLeavesMember(t *testing.T) {
	c, err := etcdserver.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := c.Members[0]
	garbage := filepath.Join(t.TempDir(), "garbage.db")
	if err := os.WriteFile(garbage, []byte("not a snapshot"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, snapshot := range []string{filepath.Join(t.TempDir(), "missing.db"), garbage} {
		before := put(t, m.ClientURL)
		err := m.Restore(snapshot, 1000)
		t.Logf("Restore(%s) = %v", filepath.Base(snapshot), err)
		if err == nil {
			t.Fatalf("Restore from %s succeeded", snapshot)
		}
		if !m.Running() {
			t.Fatalf("Running() = false after a failed Restore from %s", filepath.Base(snapshot))
		}
		if err := m.WaitReady(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		if after := put(t, m.ClientURL); after != before+1 {
			t.Fatalf("revision after a failed Restore %d, want %d (the data kept)", after, before+1)
		}
		left, err := filepath.Glob(filepath.Join(m.Dir, "*"))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range left {
			if b := filepath.Base(p); b != "data" && b != "etcd.yaml" && b != "etcd.log" {
				t.Errorf("%s left in the member's directory", b)
			}
		}
	}
}

// TestRestoreModeRefusesBumpWithoutMarkCompacted: etcdutl's snapshot
// package bumps nothing, silently, given -bump-revision without
// -mark-compacted, so etcdmain restore refuses either flag without the
// other, before it reads the snapshot or writes anything.
func TestRestoreModeRefusesBumpWithoutMarkCompacted(t *testing.T) {
	bin, err := etcdserver.Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "etcd.yaml")
	data := filepath.Join(dir, "data")
	if err := os.WriteFile(cfg, []byte("name: m0\ndata-dir: "+data+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, flags := range [][]string{{"-bump-revision", "1000"}, {"-mark-compacted"}} {
		out, err := exec.Command(bin, append(append([]string{"restore"}, flags...), filepath.Join(dir, "snap.db"), cfg)...).CombinedOutput()
		t.Logf("restore %v: %v: %s", flags, err, strings.TrimSpace(string(out)))
		if err == nil {
			t.Errorf("restore %v succeeded", flags)
		}
		if !strings.Contains(string(out), "-mark-compacted is required with -bump-revision") {
			t.Errorf("restore %v: %q, want the refusal", flags, out)
		}
		if _, err := os.Stat(data); !os.IsNotExist(err) {
			t.Errorf("restore %v made the data dir (%v)", flags, err)
		}
	}
}
