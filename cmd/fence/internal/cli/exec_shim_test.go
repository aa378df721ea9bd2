//go:build linux

package cli_test

import (
	"bytes"
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

// shimArg0 is argv[0] of fence re-executed as the exec shim.
const shimArg0 = "fence: exec shim"

// TestExecShimPassesThrough: the command runs under the exec shim (its
// parent is fence re-executed, not fence), and what it gets and gives is
// unchanged by it: its exit code, its death by a signal as 128 + the
// signal, its stdin (a pipe), stdout and stderr.
func TestExecShimPassesThrough(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "shim-io", "--", "sh", "-c",
		`read line; echo "got:$line"; echo "err:$line" >&2; tr '\0' '\n' < /proc/$PPID/cmdline | head -n 1`)
	cmd.Stdin = strings.NewReader("hello\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("fence exec: %v; stderr %q", err, stderr.String())
	}
	if got, want := stdout.String(), "got:hello\n"+shimArg0+"\n"; got != want {
		t.Errorf("stdout %q, want %q (the line read from stdin, then the parent's argv[0])", got, want)
	}
	if got := stderr.String(); got != "err:hello\n" {
		t.Errorf("stderr %q, want %q", got, "err:hello\n")
	}
	for _, c := range []struct {
		script string
		want   int
	}{
		{"exit 0", 0},
		{"exit 3", 3},
		{"exit 255", 255},
		{"kill -KILL $$", 128 + int(syscall.SIGKILL)},
		{"kill -QUIT $$", 128 + int(syscall.SIGQUIT)},
		{"kill -USR1 $$", 128 + int(syscall.SIGUSR1)},
		{"kill -SEGV $$", 128 + int(syscall.SIGSEGV)},
	} {
		if _, errOut, code := fence(t, nil, "exec", "--redis", redisURL(srv), "shim-code", "--", "sh", "-c", c.script); code != c.want {
			t.Errorf("sh -c %q: exit %d, want %d; stderr %q", c.script, code, c.want, errOut)
		}
	}
}

// TestExecShimPassesTerminal: on a terminal, the command's stdin, stdout
// and stderr are that terminal, as without the shim.
func TestExecShimPassesTerminal(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	master, slave := openPTY(t)
	defer master.Close()
	want := slave.Name()
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "shim-tty", "--", "sh", "-c",
		`test -t 0 && test -t 1 && test -t 2 && echo "tty:$(tty)"`)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	var out bytes.Buffer
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = out.ReadFrom(master) })
	runUntil(t, cmd, time.Minute)
	wg.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(out.String(), "tty:"+want) {
		t.Fatalf("exit %d, terminal %q; want tty:%s", code, out.String(), want)
	}
}

// TestExecShimSurvivesGroupSignals: a signal sent to the command's group
// reaches the shim too. The shim must not die of one that the command
// handles (here SIGQUIT, SIGTRAP, SIGSYS and SIGABRT, which end a Go
// program with a stack dump, and SIGHUP), trapped and survived by the
// command. Not caught, the shim died of them and fence reported its death
// (exit 2) instead of the command's status, the command left without the
// parent that ends it if fence dies.
func TestExecShimSurvivesGroupSignals(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	sigs := []syscall.Signal{syscall.SIGQUIT, syscall.SIGTRAP, syscall.SIGSYS, syscall.SIGABRT, syscall.SIGHUP}
	script := `trap 'echo sig' QUIT TRAP SYS ABRT HUP; echo $$ > D/pid.tmp; mv D/pid.tmp D/pid; ` +
		strings.Repeat("read x; ", len(sigs)) + `echo done`
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "shim-sig", "--", "bash", "-c", strings.ReplaceAll(script, "D/", dir+"/"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := readPID(t, filepath.Join(dir, "pid"))
	pgid, err := syscall.Getpgid(pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, sig := range sigs {
		if err := syscall.Kill(-pgid, sig); err != nil {
			t.Fatal(err)
		}
		if _, err := stdin.Write([]byte("\n")); err != nil {
			t.Fatal(err)
		}
	}
	_ = stdin.Close()
	runUntil(t, cmd, time.Minute)
	if code := cmd.ProcessState.ExitCode(); code != 0 || !strings.HasSuffix(stdout.String(), "done\n") {
		t.Fatalf("after %v to the group: exit %d, stdout %q; want exit 0 after done", sigs, code, stdout.String())
	}
}

// TestExecBackgroundDiesWithFence: fence is killed with SIGKILL while the
// command runs with a background job and a process that ignores SIGTERM.
// Pdeathsig ended only the command itself, and the rest of its group ran
// on with nobody holding the lock; the shim ends the group, SIGTERM then
// SIGKILL after --grace.
func TestExecBackgroundDiesWithFence(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	script := `
		sleep 60 & echo $! > D/bg.tmp; mv D/bg.tmp D/bg
		(trap "" TERM; exec sleep 61) & echo $! > D/stubborn.tmp; mv D/stubborn.tmp D/stubborn
		wait`
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "--grace", "300ms", "shim-bg", "--",
		"sh", "-c", strings.ReplaceAll(script, "D/", dir+"/"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	bg := watch(t, readPID(t, filepath.Join(dir, "bg")))
	stubborn := watch(t, readPID(t, filepath.Join(dir, "stubborn")))
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if !bg.exited(10 * time.Second) {
		t.Error("the command's background job still runs 10s after fence was killed")
	}
	if !stubborn.exited(10 * time.Second) {
		t.Error("the command's process ignoring SIGTERM still runs 10s after fence was killed (--grace 300ms)")
	}
}

// TestExecShimNotByAccident: fence started as the shim (its argv[0])
// without the pipes fence exec gives it runs nothing and says so.
func TestExecShimNotByAccident(t *testing.T) {
	t.Parallel()
	ran := filepath.Join(t.TempDir(), "ran")
	cmd := &exec.Cmd{Path: fenceBin, Args: []string{shimArg0, "1s", "/usr/bin/touch", "touch", ran}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if _, statErr := os.Stat(ran); statErr == nil {
		t.Error("the shim ran a command without fence exec")
	}
	if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(stderr.String(), "fence exec only") {
		t.Errorf("%v: exit %d, stderr %q; want 2 and a message", err, code, stderr.String())
	}
}

// TestExecStoppedCommandDiesWithFence: the command's group is stopped
// (SIGTSTP, as ^Z sends; fence follows and stops itself), and then fence
// is killed with SIGKILL. The stopped shim must still end the command, a
// set-user-ID one (no Pdeathsig) that ignores SIGHUP: the kernel continues
// a stopped group that fence's death orphans (with SIGHUP), and the shim,
// continued, sees fence gone. Here fence's new parent is a child subreaper
// in fence's session (the test, as an outer fence exec would be), which
// keeps the group from being orphaned: the kernel does not continue it.
func TestExecStoppedCommandDiesWithFence(t *testing.T) {
	// Not parallel: the test process is a subreaper only while no other
	// test runs, and reaps what it adopted.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				return
			}
		}
	})
	srv := redistest.Start(t)
	dir := t.TempDir()
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "shim-stopped", "--", "sh", "-c",
		`trap "" HUP; echo $$ > `+dir+`/pid.tmp; mv `+dir+`/pid.tmp `+dir+`/pid; exec "$0" 60`, setuidSleep(t))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := readPID(t, filepath.Join(dir, "pid"))
	child := watch(t, pid)
	pgid, err := syscall.Getpgid(pid)
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() {
		var info unix.Siginfo
		stopped <- unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WSTOPPED, nil)
	}()
	if err := syscall.Kill(-pgid, syscall.SIGTSTP); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("fence did not stop within 30s of SIGTSTP to the command's group")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if !child.exited(10 * time.Second) {
		t.Fatal("the stopped command still runs 10s after fence was killed")
	}
}

// TestExecPassesInheritedDescriptors: descriptors fence inherits beyond
// stdin, stdout and stderr (a socket from systemd's socket activation,
// "3< file" in a shell) reach the command at the same numbers, as they did
// before the shim: the shim's own pipes must not take their place.
func TestExecPassesInheritedDescriptors(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	dir := t.TempDir()
	var files []*os.File
	for i, content := range []string{"three", "four", "five"} {
		name := filepath.Join(dir, content)
		if err := os.WriteFile(name, []byte(content+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if i == 1 {
			f = nil // fd 4 is not passed: the command must not find one
		}
		files = append(files, f)
	}
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "shim-fds", "--", "sh", "-c",
		`cat <&3; cat <&5; if (: <&4) 2>/dev/null; then echo "fd 4 open"; fi`)
	cmd.ExtraFiles = files
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("fence exec: %v; stderr %q", err, stderr.String())
	}
	if got, want := stdout.String(), "three\nfive\n"; got != want {
		t.Fatalf("the command read %q from its descriptors 3, 5 (and 4), want %q; stderr %q", got, want, stderr.String())
	}
}

// TestExecSetuidRootCommandDiesWithNonRootFence: fence runs as an ordinary
// user (nobody) and its command is set-user-ID root, keeping the caller
// as its real user (as sudo does). The shim, running as that user, may
// signal it, and ends it when fence is killed with SIGKILL.
func TestExecSetuidRootCommandDiesWithNonRootFence(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root to make a set-user-ID root copy of sleep")
	}
	dir, err := os.MkdirTemp("", "fence-setuid-root")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile := func(src, dst string, mode os.FileMode) {
		t.Helper()
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dst, mode); err != nil {
			t.Fatal(err)
		}
	}
	bin, suid := filepath.Join(dir, "fence"), filepath.Join(dir, "sleep")
	copyFile(fenceBin, bin, 0o755)
	copyFile("/bin/sleep", suid, os.ModeSetuid|0o755)
	srv := redistest.Start(t)
	cmd := exec.Command(bin, "exec", "--redis", redisURL(srv), "setuid-root", "--", suid, "60")
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	// A file, not a pipe: Wait would wait for a surviving command that
	// holds the pipe open.
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var child int
	deadline := time.Now().Add(30 * time.Second)
	for child == 0 {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			b, _ := os.ReadFile(stderr.Name())
			t.Fatalf("the command did not start within 30s; stderr %q", b)
		}
		exes, _ := filepath.Glob("/proc/[0-9]*/exe")
		for _, e := range exes {
			if target, _ := os.Readlink(e); target == suid {
				child, _ = strconv.Atoi(filepath.Base(filepath.Dir(e)))
			}
		}
	}
	p := watch(t, child)
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(child) + "/status"); err != nil || !strings.Contains(string(b), "\nUid:\t65534\t0\t0\t0\n") {
		t.Fatalf("the command's user IDs are not real nobody, effective root: %s", b)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if !p.exited(10 * time.Second) {
		t.Fatal("the set-user-ID root command still runs 10s after the non-root fence was killed")
	}
}
