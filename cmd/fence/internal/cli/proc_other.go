//go:build !linux

package cli

import (
	"os"
	"syscall"
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

// fdDir lists the process's open descriptors (see inheritedFDs).
const fdDir = "/dev/fd"
