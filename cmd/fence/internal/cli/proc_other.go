//go:build !linux

package cli

import (
	"os"
	"slices"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// procAttr: a process group of its own, for the shim and the command.
// Without Linux there is no Pdeathsig (the shim's watch on fence remains),
// and the command does not get the terminal's foreground: a command that
// reads the terminal is stopped by SIGTTIN (see proc_linux.go).
func procAttr(int) *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// shimChildAttr: the command stays in the shim's group.
func shimChildAttr() *syscall.SysProcAttr { return nil }

// selfExe is the path that re-executes fence (the shim).
func selfExe() (string, error) { return os.Executable() }

func controllingTTY() int  { return -1 }
func foregroundTTY() int   { return -1 }
func takeTerminal(int)     {}
func reclaimTerminal(int)  {}
func followStops(int, int) {}
func adoptOrphans()        {}
func reapOrphans()         {}
func reapAdopted(int)      {}

// groupMembers: the group's leader stands for the group while any member
// is left.
func groupMembers(pgid int) []int {
	if syscall.Kill(-pgid, 0) == nil {
		return []int{-pgid}
	}
	return nil
}

// inheritedFDs returns, in order, fence's descriptors from 3 up that are
// not close-on-exec: those its caller passed on for the command (fence's
// own are all close-on-exec, as Go opens them).
func inheritedFDs() []int {
	names, err := os.ReadDir("/dev/fd")
	if err != nil {
		return nil
	}
	var fds []int
	for _, n := range names {
		fd, err := strconv.Atoi(n.Name())
		if err != nil || fd < 3 {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			fds = append(fds, fd)
		}
	}
	slices.Sort(fds)
	return fds
}
