package cli

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// procAttr is how fence exec starts the command. It always gets a process
// group of its own, so that everything it starts can be ended with it; when
// fence runs in the foreground of its terminal (tty is that terminal's
// descriptor), the new group is made the terminal's foreground group, so
// that the command can read the terminal and gets ^C and ^Z itself. Without
// this, a command that reads the terminal from a background group is stopped
// by SIGTTIN, and fence would wait for it for ever while the watchdog keeps
// the lock. (Not creating a group when stdin is a terminal would also keep
// the terminal usable, but then fence could not end the command's
// background processes without ending itself.)
//
// Pdeathsig kills the command when fence dies, even by SIGKILL. The kernel
// sends it when the thread that forked the child exits, not the process:
// startLocked forks on a goroutine locked to its thread until the child has
// been waited for, and Go ends a thread only when a goroutine exits while
// locked to it, so the thread outlives the child.
func procAttr(tty int) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if tty >= 0 {
		a.Foreground, a.Ctty = true, tty
	}
	return a
}

// foregroundTTY returns stdin's descriptor if stdin is fence's controlling
// terminal and fence's process group is in its foreground; else -1. A fence
// started in the background (with &) leaves the terminal alone.
func foregroundTTY() int {
	fd := int(os.Stdin.Fd())
	pg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP) // ENOTTY unless our controlling terminal
	if err != nil || pg != unix.Getpgrp() {
		return -1
	}
	return fd
}

// takeForeground makes fence's group the terminal's foreground group again.
// fence is in the background when it does this, so SIGTTOU is ignored
// (runHolding ignores it while the command has the terminal).
func takeForeground(tty int) {
	_ = unix.IoctlSetPointerInt(tty, unix.TIOCSPGRP, unix.Getpgrp())
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
