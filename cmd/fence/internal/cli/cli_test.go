package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/testmain"
)

// fenceBin is the fence binary built once for the package's tests.
var fenceBin string

// The environment of the fenced writer (TestFencedWriterHelper): the
// address of the guarded server it writes to, and a directory where it
// waits for a file "go" before it writes, and leaves the status it got in
// a file "status". (Not named like a URL: fence exec does not pass FENCE_…
// URL variables to the command, and these are not fence's anyway.)
const (
	writerAddrEnv = "GUARDTEST_ADDR"
	writerDirEnv  = "GUARDTEST_DIR"
)

func TestMain(m *testing.M) {
	testmain.Run(m, func() (func(), error) {
		for _, a := range os.Args[1:] {
			if strings.HasPrefix(a, "-test.fuzz") {
				return func() {}, nil // fuzz targets and their workers run no command
			}
		}
		if os.Getenv(writerAddrEnv) != "" {
			return func() {}, nil // a fenced writer that a test runs under fence exec
		}
		dir, err := os.MkdirTemp("", "fence-cli")
		if err != nil {
			return nil, err
		}
		fenceBin = filepath.Join(dir, "fence")
		// The race runtime sleeps a second before a race-built process
		// exits; the tests run fence hundreds of times (status --help took
		// 1.2 s, 0.2 s without it). Its other options (log_path in CI) stay.
		if err := os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")); err != nil {
			return nil, err
		}
		if out, err := exec.Command("go", "build", "-race", "-o", fenceBin, "github.com/fencekit/fence/cmd/fence").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build fence: %w\n%s", err, out)
		}
		return func() { _ = os.RemoveAll(dir) }, nil
	})
}

// fence runs the binary and returns its stdout, stderr and exit code.
func fence(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, fenceBin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("fence %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

func redisURL(srv *redistest.Server) string { return "redis://" + srv.Addr }

func TestExecPassesTokenAndExitCode(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	out, errOut, code := fence(t, nil, "exec", "--redis", redisURL(srv), "lock:payment:1001", "--",
		"sh", "-c", `echo "$FENCE_LOCK $FENCE_TOKEN"`)
	fields := strings.Fields(out)
	if code != 0 || len(fields) != 2 || fields[0] != "lock:payment:1001" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if tok, err := strconv.ParseInt(fields[1], 10, 64); err != nil || tok <= 0 {
		t.Fatalf("FENCE_TOKEN = %q, want a positive integer", fields[1])
	}
	// The URL can come from the environment instead of the command line.
	_, errOut, code = fence(t, []string{"FENCE_REDIS_URL=" + redisURL(srv)}, "exec", "lock:payment:1001", "--", "sh", "-c", "exit 7")
	if code != 7 {
		t.Fatalf("child exit 7 came back as %d (%s)", code, errOut)
	}
	_, _, code = fence(t, nil, "exec", "--redis", redisURL(srv), "n", "--", "sh", "-c", "kill -TERM $$")
	if code != 128+15 {
		t.Fatalf("child killed by SIGTERM came back as %d, want 143", code)
	}
	_, _, code = fence(t, nil, "exec", "--redis", redisURL(srv), "n", "--", "/nonexistent/command")
	if code != 127 {
		t.Fatalf("missing command: exit %d, want 127", code)
	}
	// The lock was released each time.
	out, _, _ = fence(t, nil, "status", "--redis", redisURL(srv), "lock:payment:1001")
	if !strings.Contains(out, "free") {
		t.Fatalf("status after exec: %q", out)
	}
}

func TestExecUsageAndNotAcquired(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, args := range [][]string{
		{"exec", "--redis", redisURL(srv), "name-without-command"},
		{"exec", "--redis", redisURL(srv), "name", "cmd-without-dash"},
		{"exec", "--redis", redisURL(srv), "bad{name}", "--", "true"},
		{"exec", "--redis", redisURL(srv), "--ttl", "0s", "n", "--", "true"},
		{"exec", "--redis", redisURL(srv), "--wait", "-1s", "n", "--", "true"},
		{"exec", "--redis", "notaurl", "n", "--", "true"},
		{"status"},
	} {
		if _, errOut, code := fence(t, nil, args...); code != cli.ExitUsage || errOut == "" {
			t.Errorf("fence %v: exit %d (%q), want %d with a message", args, code, errOut, cli.ExitUsage)
		}
	}
	srv2 := redistest.Start(t)
	dead := redisURL(srv2)
	srv2.Kill()
	if _, _, code := fence(t, nil, "exec", "--redis", dead, "n", "--", "true"); code != cli.ExitUsage {
		t.Errorf("dead server: exit %d, want %d", code, cli.ExitUsage)
	}

	// Held by a running exec: a second one with a short wait gives up with 75.
	dir := t.TempDir()
	holder := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "held", "--", "sh", "-c", "touch "+dir+"/started; cat >/dev/null")
	stdin, _ := holder.StdinPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, dir+"/started")
	start := time.Now()
	_, errOut, code := fence(t, nil, "exec", "--redis", redisURL(srv), "--wait", "300ms", "held", "--", "true")
	if code != cli.ExitNotAcquired || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("second exec: exit %d after %v (%s), want %d after the wait", code, time.Since(start), errOut, cli.ExitNotAcquired)
	}
	if !strings.HasPrefix(errOut, "fence: lock not acquired") {
		t.Errorf("second exec's stderr %q, want it to begin \"fence: lock not acquired\" (the prefix said once)", errOut)
	}
	out, _, _ := fence(t, nil, "status", "--redis", redisURL(srv), "--json", "held")
	if !strings.Contains(out, `"held":true`) {
		t.Fatalf("status --json while held: %s", out)
	}

	// Interrupted while waiting: 130, promptly.
	waiter := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "--wait", "60s", "held", "--", "true")
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	admin := srv.Client(t)
	deadline := time.Now().Add(30 * time.Second)
	for admin.PubSubNumSub(context.Background(), "fence:{held}:released").Val()["fence:{held}:released"] == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the waiting exec never subscribed")
		}
		tick := time.NewTimer(5 * time.Millisecond)
		<-tick.C
	}
	_ = waiter.Process.Signal(os.Interrupt)
	_ = waiter.Wait()
	if code := waiter.ProcessState.ExitCode(); code != cli.ExitInterrupted {
		t.Fatalf("interrupted exec: exit %d, want %d", code, cli.ExitInterrupted)
	}
	stdin.Close()
	if err := holder.Wait(); err != nil {
		t.Fatalf("holder: %v", err)
	}
}

// TestExecNeverOverlaps: concurrent fence exec on one name; the children
// record their intervals, and no two intersect.
func TestExecNeverOverlaps(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	log := filepath.Join(t.TempDir(), "intervals")
	const procs, rounds = 4, 3
	var wg sync.WaitGroup
	for p := range procs {
		wg.Go(func() {
			for r := range rounds {
				script := fmt.Sprintf(`echo "start $(date +%%s%%N) %d.%d" >> %s; sleep 0.05; echo "end $(date +%%s%%N) %d.%d" >> %s`, p, r, log, p, r, log)
				if _, errOut, code := fence(t, nil, "exec", "--redis", redisURL(srv), "--wait", "60s", "shared", "--", "sh", "-c", script); code != 0 {
					t.Errorf("exec %d.%d: exit %d: %s", p, r, code, errOut)
				}
			}
		})
	}
	wg.Wait()
	f, err := os.Open(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type interval struct{ start, end int64 }
	runs := map[string]*interval{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kind, id string
		var at int64
		if _, err := fmt.Sscan(sc.Text(), &kind, &at, &id); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if runs[id] == nil {
			runs[id] = &interval{}
		}
		if kind == "start" {
			runs[id].start = at
		} else {
			runs[id].end = at
		}
	}
	var all []*interval
	for _, iv := range runs {
		all = append(all, iv)
	}
	if len(all) != procs*rounds {
		t.Fatalf("%d runs recorded, want %d", len(all), procs*rounds)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].start < all[j].start })
	for i := 1; i < len(all); i++ {
		if all[i].start < all[i-1].end {
			t.Fatalf("runs overlap: [%d, %d] and [%d, %d]", all[i-1].start, all[i-1].end, all[i].start, all[i].end)
		}
	}
}

// TestExecKillsChildOnLostLease: the key is deleted behind the holder's
// back; the child, which ignores SIGTERM, is killed within the renewal
// interval plus the grace period, and exec exits 76.
func TestExecKillsChildOnLostLease(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const renewEvery, grace = 200 * time.Millisecond, 500 * time.Millisecond
	dir := t.TempDir()
	cmd := exec.Command(fenceBin, "exec", "--redis", redisURL(srv), "--watchdog-ttl", (3 * renewEvery).String(),
		"--grace", grace.String(), "doomed", "--", "sh", "-c", `trap "" TERM; touch `+dir+`/started; sleep 60`)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	waitFile(t, dir+"/started")
	deleted := time.Now()
	if n := srv.Client(t).Del(context.Background(), "fence:{doomed}").Val(); n != 1 {
		t.Fatalf("deleted %d keys, want the lock", n)
	}
	select {
	case <-exited:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		t.Fatal("fence exec still running a minute after its lock was deleted")
	}
	took := time.Since(deleted)
	if code := cmd.ProcessState.ExitCode(); code != cli.ExitLeaseLost {
		t.Fatalf("exit %d, want %d; stderr: %s", code, cli.ExitLeaseLost, stderr.String())
	}
	t.Logf("child stopped %v after the lock was deleted (renewal every %v, grace %v)", took, renewEvery, grace)
	// Renewal interval + grace, plus slack for a loaded machine.
	if limit := renewEvery + grace + 5*time.Second; took > limit { // the child would sleep 60 s
		t.Fatalf("child stopped %v after the lock was deleted, want under %v", took, limit)
	}
	if took < grace {
		t.Fatalf("child stopped after %v, before the %v grace period: SIGKILL came early", took, grace)
	}
	if !strings.Contains(stderr.String(), "SIGKILL") {
		t.Fatalf("stderr does not report the SIGKILL: %s", stderr.String())
	}
}

func TestDemoWithoutRedisServer(t *testing.T) {
	t.Parallel()
	empty := t.TempDir() // a PATH with no redis-server on it
	out, errOut, code := fence(t, []string{"PATH=" + empty}, "demo")
	if code != 0 {
		t.Fatalf("demo: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"A's write is ACCEPTED", "charged twice", "A's write is REJECTED", "charged once", "need redis-server"} {
		if !strings.Contains(out, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b[") {
		t.Fatal("demo printed colour codes into a pipe")
	}
}

func TestDemoFailoverStories(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server not found on PATH: install it with `apt-get install -y redis-server` (`make test` does this)")
	}
	out, errOut, code := fence(t, nil, "demo")
	if code != 0 {
		t.Fatalf("demo: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"two workers hold lock:payment:1001", "is REFUSED: 0 of 1 replicas"} {
		if !strings.Contains(out, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, out)
		}
	}
}

// waitFile waits for a file to appear, failing after 30 s.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within 30s", path)
		}
		<-tick.C
	}
}

// TestExecFixedTTLEndsChild: with --ttl the lease is not renewed, so the
// child is stopped when it runs out.
func TestExecFixedTTLEndsChild(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	start := time.Now()
	_, errOut, code := fence(t, nil, "exec", "--redis", redisURL(srv), "--ttl", "300ms", "--grace", "200ms", "short", "--", "sleep", "30")
	took := time.Since(start)
	if code != cli.ExitLeaseLost {
		t.Fatalf("exit %d, want %d: %s", code, cli.ExitLeaseLost, errOut)
	}
	if took > 10*time.Second {
		t.Fatalf("child ran %v past a 300ms lease", took)
	}
}

// TestExecOnClusterAndSentinel: the same exec through a Redis Cluster and
// through Sentinels.
func TestExecOnClusterAndSentinel(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	addrs := cluster.Addrs()
	clusterURL := "redis://" + addrs[0] + "?addr=" + addrs[1] + "&addr=" + addrs[2]

	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	sentinels := redistest.StartSentinels(t, primary, 3)
	redistest.WaitSentinelsReady(t, sentinels, 1)
	sa := sentinels.Addrs()
	sentinelURL := "redis://" + sa[0] + "?master_name=" + sentinels.Master + "&addr=" + sa[1] + "&addr=" + sa[2]

	replicas := map[string]string{"--redis-cluster": "replicas 0 expected, 0 connected", "--redis-sentinel": "replicas 1 expected, 1 connected"}
	for _, flags := range [][]string{{"--redis-cluster", clusterURL}, {"--redis-sentinel", sentinelURL}} {
		args := append(append([]string{"exec"}, flags...), "lock:payment:1001", "--", "sh", "-c", `echo "$FENCE_TOKEN"`)
		out, errOut, code := fence(t, nil, args...)
		if tok, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64); code != 0 || err != nil || tok <= 0 {
			t.Fatalf("fence %v: exit %d, stdout %q, stderr %q", flags, code, out, errOut)
		}
		out, errOut, code = fence(t, nil, append(append([]string{"status"}, flags...), "lock:payment:1001")...)
		if code != 0 || !strings.Contains(out, "free; last token") || !strings.Contains(out, replicas[flags[0]]) {
			t.Fatalf("status %v: exit %d, %q %q", flags, code, out, errOut)
		}
	}
	if _, errOut, code := fence(t, nil, "status", "--redis-sentinel", "redis://"+sa[0], "x"); code != cli.ExitUsage || !strings.Contains(errOut, "master_name") {
		t.Fatalf("sentinel URL without master_name: exit %d, %q", code, errOut)
	}
}

// TestErrorSaysFenceOnce: an error of fence's own that wraps the library's
// (a flag's value refused by fence.ValidateTTL) is printed with the prefix
// "fence: " once, not "fence: --ttl 5ms: fence: invalid option".
func TestErrorSaysFenceOnce(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"exec", "--ttl", "5ms", "n", "--", "true"},
		{"exec", "--watchdog-ttl", "1ms", "n", "--", "true"},
	} {
		_, errOut, code := fence(t, nil, args...)
		if code != cli.ExitUsage || strings.Count(errOut, "fence:") != 1 || !strings.Contains(errOut, "invalid option") {
			t.Errorf("fence %v: exit %d, stderr %q: want exit %d and one \"fence:\"", args, code, errOut, cli.ExitUsage)
		}
	}
}
