package child

import (
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// DieWithParent makes the kernel kill cmd's process when the thread that
// starts it exits (PR_SET_PDEATHSIG), which for a process started from Go
// is in practice when the parent process dies. Call it before cmd.Start;
// the rest of cmd.SysProcAttr is kept.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// StopSelf stops the calling process with SIGSTOP sent to the calling
// thread, and returns once the process is continued. Sent to the process,
// the signal may be taken by another thread while this one runs on for a
// moment, doing what the stop was meant to delay.
func StopSelf() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}
