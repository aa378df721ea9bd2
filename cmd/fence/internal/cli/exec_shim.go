package cli

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The exec shim is fence re-executed (selfExe) as the command's parent,
// between fence and the command, so that the command dies with fence even
// when it changes its credentials at exec. Pdeathsig alone did not do it:
// the kernel clears it when an exec changes the user or group (set-user-ID
// or set-group-ID programs such as sudo and su, file capabilities), so such
// a command ran on after fence was killed with SIGKILL, its lease expiring
// under it (TestExecSetuidCommandDiesWithFence). The shim never changes
// its credentials, so nothing of the kind is lost for it.
//
// The shim learns of fence's death by end-of-file on a pipe whose write end
// only fence holds (the alive pipe): the kernel closes it when fence dies,
// however it dies, and nothing else can close it, whereas a death signal
// could not be told apart from the signals sent to the command's group,
// which the shim is part of. It then ends the group as exec would: SIGTERM
// (with SIGCONT), then SIGKILL after --grace. As root it may signal a
// set-user-ID process; another user may signal one whose real user is
// theirs (the kernel's rule), as sudo keeps it.
//
// The shim leads the command's process group (fence starts it with
// Setpgid, and on a terminal makes the group the foreground), and the
// command runs in that group, so fence's signals to the group reach the
// command as before. The shim catches every signal it may be sent as a
// member of the group and does nothing with it (the command got its own
// copy), except SIGTSTP, SIGTTIN and SIGTTOU, which stop it along with the
// command, so that fence sees its child stop (followStops) as before.
// Caught signals are reset to their defaults by the command's exec.
//
// Alternatives, all set aside: a child subreaper does not learn of its
// parent's death; a pidfd or PR_SET_PDEATHSIG in a helper that is not the
// command's parent needs the command's pid before the command starts, which
// a sibling does not have; a PID namespace (the command as its init's child
// dies with the init) and a cgroup (cgroup.kill) need privileges that
// fence exec usually does not have.
const shimName = "fence: exec shim" // argv[0]: not a name anyone starts by accident

// The shim gets two pipes besides stdin, stdout and stderr, at descriptors
// past those fence inherited for the command (see inheritedFDs), whose
// numbers are its first two arguments: the alive pipe's read end, whose
// write end only fence holds (end-of-file says fence is gone), and the
// report pipe's write end, on which the shim says "ok" once the command has
// started, else why it could not be, on one line. At 3 and 4 they took the
// place of descriptors the command used to inherit from fence's caller (a
// socket from systemd's socket activation, "3< file" in a shell:
// TestExecPassesInheritedDescriptors).

// isShim reports whether this process is fence re-executed as the exec
// shim (by startShim).
func isShim() bool { return len(os.Args) > 0 && os.Args[0] == shimName }

// shimMaxSignal is the largest signal number the shim catches: Linux's
// real-time signals end at 64; Notify passes over numbers a system does
// not have.
const shimMaxSignal = 64

// shimStarted is the report of a command that started.
const shimStarted = "ok"

// shimCommand is the running shim, with fence's ends of its pipes.
type shimCommand struct {
	*exec.Cmd
	alive  *os.File // fence's end of the alive pipe: open as long as fence runs
	report *os.File // fence's end of the report pipe
	// inherited are the descriptors passed on: kept from the finalizer
	// that would close them while the shim starts.
	inherited []*os.File
}

// startShim starts the shim that runs child and ends its group, SIGTERM
// then SIGKILL after grace, if fence dies. child must be as exec.Command
// made it (its path resolved, child.Err the error), with Env, Stdin,
// Stdout, Stderr and SysProcAttr set: the shim gets them, and passes its
// environment and standard descriptors on to the command. The command has
// not started yet when it returns: see waitStarted.
func startShim(child *exec.Cmd, grace time.Duration) (*shimCommand, error) {
	if child.Err != nil {
		return nil, child.Err
	}
	exe, err := selfExe()
	if err != nil {
		return nil, fmt.Errorf("fence exec cannot re-execute itself to run the command: %w", err)
	}
	// The descriptors fence inherited stay at their numbers; those of
	// fence's own, close-on-exec, are closed in the shim (nil entries).
	inherited := inheritedFDs()
	var extra []*os.File
	for _, fd := range inherited {
		for len(extra) < fd-3 {
			extra = append(extra, nil)
		}
		extra = append(extra, os.NewFile(uintptr(fd), "inherited"))
	}
	aliveFD := 3 + len(extra)
	aliveR, aliveW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	reportR, reportW, err := os.Pipe()
	if err != nil {
		_ = aliveR.Close()
		_ = aliveW.Close()
		return nil, err
	}
	shim := &exec.Cmd{
		Path:        exe,
		Args:        append([]string{shimName, strconv.Itoa(aliveFD), strconv.Itoa(aliveFD + 1), grace.String(), child.Path}, child.Args...),
		Env:         child.Env,
		Stdin:       child.Stdin,
		Stdout:      child.Stdout,
		Stderr:      child.Stderr,
		ExtraFiles:  append(extra, aliveR, reportW),
		SysProcAttr: child.SysProcAttr,
	}
	err = shim.Start()
	_ = aliveR.Close()
	_ = reportW.Close()
	if err != nil {
		_ = aliveW.Close()
		_ = reportR.Close()
		return nil, err
	}
	return &shimCommand{Cmd: shim, alive: aliveW, report: reportR, inherited: extra}, nil
}

// waitStarted returns once the shim has started the command, or with the
// reason it could not (the shim has then exited, or is exiting).
func (s *shimCommand) waitStarted() error {
	defer s.report.Close()
	line, err := bufio.NewReader(s.report).ReadString('\n')
	line = strings.TrimSuffix(line, "\n")
	switch {
	case line == shimStarted:
		return nil
	case line != "":
		return errors.New(line)
	default:
		return fmt.Errorf("fence exec's shim ended before it started the command (%v)", err)
	}
}

// close closes fence's end of the alive pipe, after the shim has exited.
func (s *shimCommand) close() {
	_ = s.alive.Close()
	runtime.KeepAlive(s.inherited)
}

// runShim is the shim's main: args are the alive and report pipes'
// descriptors, --grace, the command's path and its argv. It returns the command's exit status as exec reports it (128 +
// the signal that ended it), which fence passes through unchanged, or 127
// if the command could not be started.
func runShim(args []string) int {
	var fds [2]int
	for i := range fds {
		var st syscall.Stat_t
		fd, err := strconv.Atoi(firstOr(args[min(i, len(args)):], ""))
		if err != nil || fd < 3 || syscall.Fstat(fd, &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
			fmt.Fprintln(os.Stderr, "fence: the exec shim is started by fence exec only")
			return ExitUsage
		}
		syscall.CloseOnExec(fd) // not for the command
		fds[i] = fd
	}
	aliveFD, report := fds[0], os.NewFile(uintptr(fds[1]), "fence exec report")
	args = args[2:]
	if len(args) < 3 {
		fmt.Fprintf(report, "fence exec's shim got bad arguments %q\n", args)
		return ExitUsage
	}
	grace, err := time.ParseDuration(args[0])
	if err != nil {
		fmt.Fprintf(report, "fence exec's shim got a bad --grace: %v\n", err)
		return ExitUsage
	}
	// Every signal the group gets comes here too: caught and dropped, not
	// ignored (the command would inherit SIG_IGN). The stop signals keep
	// their default, to stop the shim with the command: never passed to
	// Notify, since Reset afterwards leaves Go's handler, which drops them
	// (the shim did not stop on ^Z: TestExecSuspendOnTerminal).
	sigs := make(chan os.Signal, 16)
	for n := 1; n <= shimMaxSignal; n++ {
		switch s := syscall.Signal(n); s {
		case syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGKILL, syscall.SIGSTOP,
			syscall.SIGCONT, syscall.SIGCHLD, syscall.SIGURG, syscall.SIGWINCH:
		default:
			signal.Notify(sigs, s)
		}
	}

	gone := make(chan struct{})
	go func() {
		alive := os.NewFile(uintptr(aliveFD), "fence exec alive")
		var b [1]byte
		for {
			if _, err := alive.Read(b[:]); err != nil {
				close(gone)
				return
			}
		}
	}()

	cmd := &exec.Cmd{Path: args[1], Args: args[2:], Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		SysProcAttr: shimChildAttr()}
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		// Locked until the command has been waited for: Pdeathsig fires
		// when the forking thread ends (see procAttr).
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		fmt.Fprintln(report, strings.ReplaceAll(err.Error(), "\n", " "))
		return 127
	}
	fmt.Fprintln(report, shimStarted) // fence gone: EPIPE, and gone says so
	_ = report.Close()
	for {
		select {
		case <-exited:
			return exitCode(cmd.ProcessState)
		case <-gone:
			endGroupOrphaned(syscall.Getpgrp(), grace, sigs)
			select {
			case <-exited:
				return exitCode(cmd.ProcessState)
			default:
				return ExitLeaseLost
			}
		case <-sigs:
		}
	}
}

// endGroupOrphaned ends the shim's process group after fence died:
// SIGTERM and SIGCONT, then SIGKILL (the shim included) if any other member
// is left after grace.
func endGroupOrphaned(pgid int, grace time.Duration, sigs <-chan os.Signal) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	_ = syscall.Kill(-pgid, syscall.SIGCONT)
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	tick := time.NewTicker(groupPoll)
	defer tick.Stop()
	for len(groupMembers(pgid)) > 0 {
		select {
		case <-deadline.C:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			return
		case <-tick.C:
		case <-sigs:
		}
	}
}

func firstOr(s []string, def string) string {
	if len(s) == 0 {
		return def
	}
	return s[0]
}

// inheritedFDs returns, in order, fence's descriptors from 3 up that are
// not close-on-exec: those its caller passed on for the command (fence's
// own are all close-on-exec, as Go opens them).
func inheritedFDs() []int {
	names, err := os.ReadDir(fdDir)
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
