// Package stopped tells when a process paused with SIGSTOP has actually
// stopped. kill(2) returns with the signal pending: on a loaded machine the
// process's threads may go on running, and answer a request sent
// meanwhile, until each is scheduled again and takes the signal. The test
// servers' pauses (Redis, etcd, ZooKeeper) wait for it, so that a test that
// pauses a server and then sends it a request gets no answer.
package stopped

import (
	"bytes"
	"fmt"
	"os"
	"time"
)

// Limit is how long Wait waits by default in the servers' launchers.
const Limit = 5 * time.Second

// Wait waits, up to limit, until every thread of process pid is in the
// stopped state ('T' in /proc/pid/task/*/stat), or the process is gone.
// Where /proc cannot be read, it returns at once.
func Wait(pid int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if All(pid) {
			return
		}
		time.Sleep(time.Millisecond) // polling the kernel's view, with a deadline
	}
}

// All reports whether every thread of pid is stopped; true when /proc
// cannot tell (the process is gone, or there is no /proc).
func All(pid int) bool {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return true
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(dir + "/" + task.Name() + "/stat")
		if err != nil {
			continue // the thread exited
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) {
			continue
		}
		if st := stat[i+2]; st != 'T' && st != 't' && st != 'Z' && st != 'X' {
			return false
		}
	}
	return true
}
