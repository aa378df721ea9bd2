package cli

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// procAttr is how fence exec starts the command's process group: the exec
// shim, which runs the command in its group (see exec_shim.go). It always
// gets a process group of its own, so that everything it starts can be ended with it; when
// fence runs in the foreground of its terminal (tty is that terminal's
// descriptor), the new group is made the terminal's foreground group, so
// that the command can read the terminal and gets ^C and ^Z itself. Without
// this, a command that reads the terminal from a background group is stopped
// by SIGTTIN, and fence would wait for it for ever while the watchdog keeps
// the lock. (Not creating a group when stdin is a terminal would also keep
// the terminal usable, but then fence could not end the command's
// background processes without ending itself.)
//
// The shim must outlive fence to end the command's group when fence dies,
// which it learns from a pipe. Its Pdeathsig is SIGCONT: a shim stopped
// with the command (^Z, which fence follows) when fence is killed was left
// stopped, unable to read that pipe, when fence's new parent (a child
// subreaper: an outer fence exec, a test binary) kept its group from
// being orphaned; the kernel continues an orphaned group itself
// (TestExecStoppedCommandDiesWithFence). runHolding starts the shim on a
// goroutine locked to its thread until it has been waited for, as the
// kernel sends Pdeathsig when the forking thread ends.
func procAttr(tty int) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGCONT}
	if tty >= 0 {
		a.Foreground, a.Ctty = true, tty
	}
	return a
}

// shimChildAttr is how the shim starts the command: in the shim's group,
// and killed when the shim dies, even by SIGKILL (SIGKILL sent to the
// group, say). The kernel sends Pdeathsig when the thread that forked the
// child exits, not the process: runShim forks on a goroutine locked to its
// thread until the child has been waited for, and Go ends a thread only
// when a goroutine exits while locked to it, so the thread outlives the
// child. The kernel clears Pdeathsig at an exec that changes credentials
// (set-user-ID); then the shim's own watch on fence is what ends the
// command.
func shimChildAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }

// selfExe is the path that re-executes fence (the shim), valid even if the
// file was replaced or removed since fence started.
func selfExe() (string, error) { return "/proc/self/exe", nil }

// controllingTTY returns stdin's descriptor if stdin is fence's controlling
// terminal, else -1.
func controllingTTY() int {
	fd := int(os.Stdin.Fd())
	if _, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err != nil { // ENOTTY unless our controlling terminal
		return -1
	}
	return fd
}

// foregroundTTY returns stdin's descriptor if stdin is fence's controlling
// terminal and fence's process group is in its foreground; else -1. A fence
// started in the background (with &) leaves the terminal alone.
func foregroundTTY() int {
	fd := controllingTTY()
	if fd < 0 {
		return -1
	}
	if pg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err != nil || pg != unix.Getpgrp() {
		return -1
	}
	return fd
}

// reclaimTerminal makes fence's group the terminal's foreground group again
// if the command's group pgid has it. fence is in the background when it
// does this, so SIGTTOU must be ignored (runHolding does).
func reclaimTerminal(pgid int) {
	fd := controllingTTY()
	if fd < 0 {
		return
	}
	if pg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err == nil && pg == pgid {
		_ = unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, unix.Getpgrp())
	}
}

// takeTerminal makes fence's group the foreground group of tty (SIGTTOU
// ignored by the caller).
func takeTerminal(tty int) { _ = unix.IoctlSetPointerInt(tty, unix.TIOCSPGRP, unix.Getpgrp()) }

// followStops passes job control through fence. The shell sees fence, not
// the command's group: when the command is stopped by ^Z (SIGTSTP) or by
// touching the terminal from the background (SIGTTIN, SIGTTOU), fence takes
// the terminal back and stops itself, so that the shell regains the
// terminal and lists the job as stopped (without this, ^Z would leave the
// terminal to a stopped group, with nobody to resume it). When fence is
// continued (fg or bg), it gives the terminal to the command's group if
// fence is now in the foreground, and continues the group. A stopped fence
// renews nothing: its lease runs out after --watchdog-ttl, and on resuming
// the command is ended as for any lost lease. SIGSTOP sent to the command
// by someone else is left alone. followStops returns once pid has been
// reaped.
func followStops(pid, pgid int) {
	// SIGSTOP goes to this very thread (tgkill): sent to the process, it
	// may be taken by another thread while this one runs on and hands the
	// terminal back before fence has stopped.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for {
		sig, err := waitStop(pid)
		if err != nil {
			return
		}
		if sig != syscall.SIGTSTP && sig != syscall.SIGTTIN && sig != syscall.SIGTTOU {
			continue
		}
		reclaimTerminal(pgid)
		_ = unix.Tgkill(os.Getpid(), unix.Gettid(), unix.SIGSTOP) // returns once fence is continued
		if fd := foregroundTTY(); fd >= 0 {
			_ = unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, pgid)
		}
		_ = syscall.Kill(-pgid, syscall.SIGCONT)
	}
}

// waitStop waits until child pid is stopped and returns the signal that
// stopped it: waitid(P_PID, pid, WSTOPPED), which consumes only stop
// reports and leaves the exit to exec.Cmd.Wait (it fails with ECHILD once
// that has reaped the child).
func waitStop(pid int) (syscall.Signal, error) {
	// siginfo_t for SIGCHLD: signo, errno, code, then (after padding to
	// pointer alignment) pid, uid, status.
	var info struct {
		signo, errno, code int32
		_                  [unsafe.Sizeof(uintptr(0)) - 4]byte
		pid, uid, status   int32
		_                  [128]byte
	}
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, unix.P_PID, uintptr(pid),
			uintptr(unsafe.Pointer(&info)), unix.WSTOPPED, 0, 0)
		switch errno {
		case 0:
			return syscall.Signal(info.status), nil
		case syscall.EINTR:
			continue
		default:
			return 0, errno
		}
	}
}

var subreaperOnce sync.Once

// adoptOrphans makes fence the reaper of its orphaned descendants: a
// command's process that double-forks out of its group (a daemon, setsid)
// is reparented to fence instead of init while fence runs, so that
// groupMembers finds it and fence ends it with the rest.
func adoptOrphans() {
	subreaperOnce.Do(func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) })
}

// groupMembers returns the live (not zombie) processes of process group
// pgid, and fence's adopted orphans wherever they went (see adoptOrphans).
func groupMembers(pgid int) []int {
	self := os.Getpid()
	d, err := os.Open("/proc")
	if err != nil {
		return fallbackMembers(pgid)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fallbackMembers(pgid)
	}
	var out []int
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + n + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and ")".
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		if pgrp == pgid || ppid == self {
			out = append(out, pid)
		}
	}
	return out
}

// fallbackMembers is groupMembers without /proc: the group's leader stands
// for the group while any member is left (zombies count).
func fallbackMembers(pgid int) []int {
	if syscall.Kill(-pgid, 0) == nil {
		return []int{-pgid}
	}
	return nil
}

// reapAdopted collects the exit status of adopted orphans that have
// exited, while the command (pid) runs: each one found a zombie whose
// parent is fence, other than the command, is waited for by its own pid,
// so that the command's status stays for exec.Cmd.Wait. Without it a
// long-running command whose subprocesses leave short-lived orphans
// (system("x &"), a daemon's double fork) piled up zombies under fence
// until it exited (TestExecReapsOrphansWhileRunning).
func reapAdopted(pid int) {
	self := strconv.Itoa(os.Getpid())
	names, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range names {
		z, err := strconv.Atoi(e.Name())
		if err != nil || z == pid {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(s[i+1:]); len(f) >= 2 && f[0] == "Z" && f[1] == self {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(z, &ws, syscall.WNOHANG, nil)
		}
	}
}

// reapOrphans collects the exit status of adopted orphans that have exited,
// so that they do not stay zombies while fence runs. Only after the command
// itself has been waited for: it would take the command's status too.
func reapOrphans() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// fdDir lists the process's open descriptors (see inheritedFDs).
const fdDir = "/proc/self/fd"
