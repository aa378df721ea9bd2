package etcdserver

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/fencekit/fence/internal/child"
)

// Restore kills the member, replaces its data dir with one made from the
// snapshot file (one taken with clientv3's Maintenance.Snapshot, or
// etcdctl snapshot save) as etcdutl snapshot restore does, and starts it
// again on the same ports; it does not wait for it to serve: see
// WaitReady. A bump above zero restores with --bump-revision bump
// --mark-compacted: the member's revision starts bump above the
// snapshot's, and watches from before that get compacted errors. The
// members of a cluster are all killed first, then each is restored from
// the same snapshot.
func (m *Member) Restore(snapshot string, bump uint64) error {
	m.Kill()
	snapshot, err := filepath.Abs(snapshot)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(m.DataDir()); err != nil {
		return err
	}
	args := []string{"restore"}
	if bump > 0 {
		args = append(args, "-bump-revision", strconv.FormatUint(bump, 10), "-mark-compacted")
	}
	cmd := exec.Command(m.bin, append(args, snapshot, m.configPath())...)
	cmd.Dir = m.Dir
	child.DieWithParent(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("etcdserver: restore %s from %s: %w\n%s", m.Name, snapshot, err, tail(out))
	}
	return m.launch()
}
