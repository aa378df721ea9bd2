//go:build unix && !linux

package child

import (
	"os/exec"
	"syscall"
)

// DieWithParent does nothing on this system: it has no way to have a child
// killed with its parent (see the package doc).
func DieWithParent(*exec.Cmd) {}

// StopSelf stops the calling process with SIGSTOP and returns once it is
// continued. This system cannot direct the signal to the calling thread,
// so another thread may run on for a moment before the process stops.
func StopSelf() error {
	return syscall.Kill(syscall.Getpid(), syscall.SIGSTOP)
}
