//go:build linux

package cli_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencekit/fence/internal/redistest"
)

// readPID waits for a file that a shell wrote with "echo $pid > f.tmp; mv
// f.tmp f" and returns the pid in it.
func readPID(t *testing.T, path string) int {
	t.Helper()
	waitFile(t, path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %q", path, b)
	}
	return pid
}

// process is a pidfd: it becomes readable when the process exits, whoever
// its parent is. A process already gone has a nil pidfd.
type process struct {
	pid int
	fd  int // -1 if the process had already been reaped
}

func watch(t *testing.T, pid int) *process {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if err == unix.ESRCH {
			return &process{pid: pid, fd: -1}
		}
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	p := &process{pid: pid, fd: fd}
	t.Cleanup(func() {
		if !p.exited(0) { // don't leave it behind when the test fails
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
		_ = unix.Close(fd)
	})
	return p
}

// exited reports whether the process exits within limit (0: has exited).
func (p *process) exited(limit time.Duration) bool {
	if p.fd < 0 {
		return true
	}
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(limit)
	for {
		n, err := unix.Poll(fds, int(time.Until(deadline).Milliseconds()))
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 1
	}
}

// TestExecChildDiesWithFence: fence is killed with SIGKILL while the command
// runs; the command does not run on, orphaned (Pdeathsig).
func TestExecChildDiesWithFence(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "orphan", "--",
		"sh", "-c", "echo $$ > "+dir+"/pid.tmp; mv "+dir+"/pid.tmp "+dir+"/pid; exec sleep 60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child := watch(t, readPID(t, dir+"/pid"))
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if !child.exited(10 * time.Second) {
		t.Fatal("the command still runs 10s after fence was killed")
	}
}

// TestExecEndsLeftoversBeforeRelease: the command leaves three processes
// behind: a background sleep, one that ignores SIGTERM, and one that left
// the group for a session of its own (setsid, after a double fork). All are
// gone before the lock is free: the test watches the lock's key and, the
// moment it is gone, looks at the processes.
func TestExecEndsLeftoversBeforeRelease(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	const grace = 300 * time.Millisecond
	script := `
		sleep 60 & echo $! > D/bg.tmp; mv D/bg.tmp D/bg
		(trap "" TERM; exec sleep 61) & echo $! > D/stubborn.tmp; mv D/stubborn.tmp D/stubborn
		(setsid sleep 62 & echo $! > D/session.tmp; mv D/session.tmp D/session)
		read x || true`
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "--grace", grace.String(), "leftovers", "--",
		"sh", "-c", strings.ReplaceAll(script, "D/", dir+"/"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var procs []*process
	for _, name := range []string{"bg", "stubborn", "session"} {
		procs = append(procs, watch(t, readPID(t, filepath.Join(dir, name))))
	}
	admin := srv.Client(t)
	if admin.Exists(context.Background(), "fence:{leftovers}").Val() != 1 {
		t.Fatal("the lock is not held while the command runs")
	}
	_ = stdin.Close() // the command exits
	deadline := time.Now().Add(30 * time.Second)
	for admin.Exists(context.Background(), "fence:{leftovers}").Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("the lock is still held 30s after the command exited")
		}
	}
	for i, name := range []string{"background sleep", "sleep ignoring SIGTERM", "sleep in a new session"} {
		if !procs[i].exited(0) {
			t.Errorf("the lock was released while the %s (pid %d) still ran", name, procs[i].pid)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("fence exec: %v; stderr: %s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "SIGKILL") {
		t.Errorf("stderr does not report the SIGKILL for the process ignoring SIGTERM: %s", stderr.String())
	}
}

// openPTY returns a pseudo-terminal's master and its slave.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return m, s
}

// TestExecOnTerminal: fence runs on a terminal (a pseudo-terminal it
// controls, as a login shell's job would) and its command reads a line from
// it. In a background process group the command would be stopped by SIGTTIN
// and fence would wait for ever; the command gets the foreground instead,
// and ^C typed on the terminal reaches it.
func TestExecOnTerminal(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	run := func(script, typed string) (string, int) {
		master, slave := openPTY(t)
		defer master.Close()
		dir := t.TempDir()
		cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "tty", "--", "sh", "-c",
			"touch "+dir+"/started; "+script)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		slave.Close()
		var out bytes.Buffer
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = out.ReadFrom(master) }) // ends with EIO when the last slave closes
		waitFile(t, dir+"/started")
		if _, err := master.WriteString(typed); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Process.Kill()
			<-exited
			master.Close()
			wg.Wait()
			t.Fatalf("fence exec still running 30s after the line was typed; terminal: %q", out.String())
		}
		master.Close()
		wg.Wait()
		return out.String(), cmd.ProcessState.ExitCode()
	}
	out, code := run(`read line; echo "got:$line"`, "hello\n")
	if code != 0 || !strings.Contains(out, "got:hello") {
		t.Fatalf("exit %d, terminal %q; want the line read back", code, out)
	}
	out, code = run(`read line`, "\x03")
	if code != 128+int(syscall.SIGINT) {
		t.Fatalf("^C: exit %d, terminal %q; want %d", code, out, 128+int(syscall.SIGINT))
	}
	if out, _, _ := fence(t, nil, "status", "--redis", redisURL(srv), "tty"); !strings.Contains(out, "free") {
		t.Fatalf("lock not released: %s", out)
	}
}

// TestExecSuspendOnTerminal: ^Z stops the command (its group has the
// terminal); fence then takes the terminal back and stops itself, as a
// shell's job would, instead of leaving the terminal to a stopped group.
// Continued (as fg does), fence gives the terminal back to the command,
// which reads the next line.
func TestExecSuspendOnTerminal(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	master, slave := openPTY(t)
	defer master.Close()
	dir := t.TempDir()
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "tty", "--", "sh", "-c",
		`echo $$ > `+dir+`/started.tmp; mv `+dir+`/started.tmp `+dir+`/started; read line; echo "got:$line"`)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	fencePID := cmd.Process.Pid
	var out bytes.Buffer
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = out.ReadFrom(master) })
	defer func() {
		// Reads of the master end only when every slave is closed: on
		// failure, kill fence and the command first.
		_ = syscall.Kill(fencePID, syscall.SIGKILL)
		if pid, err := os.ReadFile(dir + "/started"); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(pid))); err == nil {
				_ = syscall.Kill(-n, syscall.SIGKILL)
			}
		}
		_ = master.Close()
		wg.Wait()
	}()
	waitFile(t, dir+"/started")
	foreground := func() int {
		pg, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPGRP)
		if err != nil {
			t.Fatal(err)
		}
		return pg
	}
	if pg := foreground(); pg == fencePID {
		t.Fatal("fence kept the terminal's foreground")
	}

	// ^Z: fence must stop (the test is its parent, so it sees the stop).
	stopped := make(chan error, 1)
	go func() {
		var info unix.Siginfo
		stopped <- unix.Waitid(unix.P_PID, fencePID, &info, unix.WSTOPPED, nil)
	}()
	if _, err := master.WriteString("\x1a"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("fence did not stop within 30s of ^Z; terminal %q", out.String())
	}
	if pg := foreground(); pg != fencePID {
		t.Fatalf("fence stopped but the terminal's foreground group is %d, not fence's %d; terminal %q", pg, fencePID, out.String())
	}

	// fg: continue fence; it hands the terminal back and continues the command.
	if err := syscall.Kill(fencePID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := master.WriteString("hello\n"); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		_ = master.Close()
		wg.Wait()
		if err != nil || !strings.Contains(out.String(), "got:hello") {
			t.Fatalf("after fg: %v; terminal %q", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("fence still running 30s after fg and a typed line; terminal %q", out.String())
	}
}

// TestExecSIGTERMWhileRunning: SIGTERM to fence while the command runs is
// passed to the command's group; fence exits with the command's status
// (143), and the lock is free, with the command gone, when fence exits.
func TestExecSIGTERMWhileRunning(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "term", "--",
		"sh", "-c", "sleep 60 & echo $! > "+dir+"/pid.tmp; mv "+dir+"/pid.tmp "+dir+"/pid; wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	bg := watch(t, readPID(t, dir+"/pid"))
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatal("fence exec still running 30s after SIGTERM")
	}
	if code := cmd.ProcessState.ExitCode(); code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit %d, want %d", code, 128+int(syscall.SIGTERM))
	}
	if !bg.exited(0) {
		t.Error("the command's background sleep outlived fence")
	}
	if n := srv.Client(t).Exists(context.Background(), "fence:{term}").Val(); n != 0 {
		t.Error("the lock is still held after fence exited")
	}
}

// TestExecEndsStoppedLeftover: the command leaves a background process that
// is stopped (here it stops itself; ^Z or SIGTTIN do the same). A stopped
// process does not act on SIGTERM until it is continued, so fence sends
// SIGCONT after the SIGTERM: the leftover ends at once, not after --grace
// (an hour here) with SIGKILL.
func TestExecEndsStoppedLeftover(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	script := `
		sh -c 'kill -STOP $$; exec sleep 63' & echo $! > D/bg.tmp; mv D/bg.tmp D/bg
		until grep -q '^State:[[:space:]]*T' /proc/$(cat D/bg)/status; do :; done`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, fenceBin, "exec", "--redis", redisURL(srv), "--grace", "1h", "stopped", "--",
		"sh", "-c", strings.ReplaceAll(script, "D/", dir+"/"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	bg := readPID(t, filepath.Join(dir, "bg"))
	t.Cleanup(func() { _ = syscall.Kill(bg, syscall.SIGKILL) })
	if err != nil || strings.Contains(stderr.String(), "SIGKILL") {
		t.Fatalf("fence exec: %v (a stopped leftover must end on SIGTERM without waiting for --grace); stderr: %s", err, stderr.String())
	}
	if syscall.Kill(bg, 0) == nil {
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(bg) + "/stat"); !strings.Contains(string(b), ") Z ") {
			t.Fatalf("the stopped leftover (pid %d) still runs after fence exec returned: %s", bg, b)
		}
	}
}
