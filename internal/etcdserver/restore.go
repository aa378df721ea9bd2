package etcdserver

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/fencekit/fence/internal/child"
)

// Restore replaces the member's data dir with one made from the snapshot
// file (one taken with clientv3's Maintenance.Snapshot, or etcdctl
// snapshot save) as etcdutl snapshot restore does, then kills the member
// and starts it again on the same ports; it does not wait for it to serve:
// see WaitReady. A bump above zero restores with --bump-revision bump
// --mark-compacted: the member's revision starts bump above the
// snapshot's, and watches from before that get compacted errors. The
// members of a cluster are all killed first, then each is restored from
// the same snapshot. The new data dir is made beside the member's, which
// it serves meanwhile: a snapshot that cannot be restored (a wrong path,
// a file that is no snapshot) leaves the member as it was, and Restore
// returns the error (it killed the member and removed its data dir
// first: TestRestoreFromBadSnapshotLeavesMember).
func (m *Member) Restore(snapshot string, bump uint64) error {
	snapshot, err := filepath.Abs(snapshot)
	if err != nil {
		return err
	}
	restored := m.DataDir() + ".restored"
	if err := os.RemoveAll(restored); err != nil {
		return err
	}
	args := []string{"restore", "-data-dir", restored}
	if bump > 0 {
		args = append(args, "-bump-revision", strconv.FormatUint(bump, 10), "-mark-compacted")
	}
	cmd := exec.Command(m.bin, append(args, snapshot, m.configPath())...)
	cmd.Dir = m.Dir
	child.DieWithParent(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(restored)
		return fmt.Errorf("etcdserver: restore %s from %s: %w\n%s", m.Name, snapshot, err, tail(out))
	}
	m.Kill()
	if err := os.RemoveAll(m.DataDir()); err != nil {
		return err
	}
	if err := os.Rename(restored, m.DataDir()); err != nil {
		return err
	}
	return m.launch()
}
