package redisserver

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The port check of commit a3ed942 tried again (branch break-today).

// foreignOn starts a redis-server of another test's on addr's port and
// returns it (its own Server, in its own temp dir).
func foreignOn(t *testing.T, addr string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(err)
	}
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	f := &Server{Dir: t.TempDir(), bin: bin, Addr: addr,
		args: []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}}
	if err := f.start(); err != nil {
		t.Fatalf("the other test's server on %s: %v", addr, err)
	}
	t.Cleanup(f.Close)
	return f
}

// redisProcsOn lists the pids of redis-server processes on port (their
// command line, as redis-server rewrites it, ends with :port; before that
// it has --port port).
func redisProcsOn(port string) []int {
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		cmd := strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " ")
		if !strings.Contains(cmd, "redis-server") {
			continue
		}
		if strings.HasSuffix(cmd, ":"+port) || strings.Contains(cmd, "--port "+port+" ") {
			pid, _ := strconv.Atoi(filepath.Base(d))
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestRestartOnTakenPort: a server is killed, another test's server takes
// its port, and the first is restarted (Restart keeps the port). Restart
// must fail, say why (errPortTaken), leave the other server alone, and
// leave no process of its own behind.
func TestRestartOnTakenPort(t *testing.T) {
	s, err := Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Kill()
	other := foreignOn(t, s.Addr)
	began := time.Now()
	err = s.Restart()
	t.Logf("Restart after %v: %.300v", time.Since(began), err)
	if !errors.Is(err, errPortTaken) {
		t.Fatalf("Restart on a port another server took = %v, want errPortTaken", err)
	}
	if pids := redisProcsOn(s.Port()); len(pids) != 1 || pids[0] != other.proc.Pid {
		t.Errorf("redis-server processes on port %s after the failed Restart: %v, want only the other's %d", s.Port(), pids, other.proc.Pid)
	}
	c := other.Client()
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Errorf("the other server after the failed Restart: %v", err)
	}
	s.Close()
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Errorf("Close after the failed Restart left %s", s.Dir)
	}
}

// TestStartOnTakenPortLeavesNothing: after start fails on a taken port
// (the retry path of launch), no redis-server of its own is left running
// on the port.
func TestStartOnTakenPortLeavesNothing(t *testing.T) {
	taken, err := Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for range 3 {
		s := &Server{Dir: t.TempDir(), bin: taken.bin, Addr: taken.Addr,
			args: []string{"--port", taken.Port(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}}
		if err := s.start(); err == nil {
			s.Close()
			t.Fatal("start on a taken port succeeded")
		}
		if pids := redisProcsOn(taken.Port()); len(pids) != 1 || pids[0] != taken.proc.Pid {
			t.Fatalf("redis-server processes on port %s after a failed start: %v, want only %d", taken.Port(), pids, taken.proc.Pid)
		}
	}
}

// TestSentinelAndClusterProveTheirPid: sentinels (redis-server --sentinel)
// and cluster nodes are started through launch too: INFO server must work
// there and name the child's pid.
func TestSentinelAndClusterProveTheirPid(t *testing.T) {
	primary, err := Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	sentinels, err := StartSentinels(primary, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer sentinels.Close()
	cluster, err := StartCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	for _, s := range append(sentinels.Servers, cluster.Servers...) {
		c := s.Client()
		info, err := c.Info(context.Background(), "server").Result()
		_ = c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := processID(info); got != s.proc.Pid {
			t.Errorf("%s: process_id %d, child %d", s.Addr, got, s.proc.Pid)
		}
	}
	if err := sentinels.Servers[0].Restart(); err != nil {
		t.Errorf("a sentinel's Restart: %v", err)
	}
}

// TestStartWithInfoRenamed: Start takes extra arguments for the server,
// and a test of how a client copes with a server that refuses INFO (a
// hosted Redis that renames or disables it, as TestCommandRenamed in the
// doctor does for WAIT and EVAL) starts one with --rename-command INFO "".
// Before a3ed942 such a server started (PING answered); now waitReady
// never gets INFO's reply and Start fails after 4 × 10 s.
func TestStartWithInfoRenamed(t *testing.T) {
	began := time.Now()
	s, err := Start("", "--rename-command", "INFO", "")
	if err != nil {
		t.Fatalf("Start with INFO renamed away, after %v: %.400v", time.Since(began), err)
	}
	s.Close()
}

// TestRestartReturnsBeforeLoaded: Start's and Restart's contract is that
// the server answers PING when they return. Redis answers INFO while it
// loads its dataset (INFO is allowed during loading, PING is not: it gets
// -LOADING), so since a3ed942 waitReady accepts a server that is still
// loading: a restarted server that has data (an RDB in its dir, or AOF
// with appendonly yes, as the doctor's durable servers have) is handed
// back before it serves, and the test's first command fails with LOADING
// (go-redis retries that a few times with backoff; other clients do not).
func TestRestartReturnsBeforeLoaded(t *testing.T) {
	s, err := Start("", "--enable-debug-command", "yes")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	// SAVE of a million keys took longer than go-redis's default 3 s
	// read timeout on a loaded machine (CI: i/o timeout).
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, ReadTimeout: time.Minute})
	defer c.Close()
	if err := c.Do(ctx, "DEBUG", "POPULATE", 1000000).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Save(ctx).Err(); err != nil { // dump.rdb, loaded at the next start
		t.Fatal(err)
	}
	for round := range 3 {
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		err := c.Ping(ctx).Err()
		info, _ := c.Info(ctx, "persistence").Result()
		loading := strings.Contains(info, "loading:1")
		if err != nil || loading {
			t.Fatalf("round %d: right after Restart returned: PING = %v, INFO says loading:1 = %v", round, err, loading)
		}
	}
}

// Restart waits for a server that loads its data for longer than
// readyTimeout, as long as the loading makes progress. In a loaded run
// TestRestartReturnsBeforeLoaded's restart, loading a million keys, took
// more than the 10 s: "redis-server on 127.0.0.1:44525 did not start:
// context deadline exceeded", its log showing it started, saved and
// restarted. Here the loading is slowed down (key-load-delay, µs per key)
// to several times a readyTimeout of a second.
func TestRestartWaitsWhileLoading(t *testing.T) {
	defer func(d time.Duration) { readyTimeout = d }(readyTimeout)
	const keys = 15000 // at 100 µs each (usleep: 200 µs and more here), 1.5 s or more
	s, err := Start("", "--key-load-delay", "100", "--loading-process-events-interval-bytes", "1024")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, ReadTimeout: time.Minute})
	defer c.Close()
	for i := 0; i < keys; i += 1000 {
		kv := make([]any, 0, 2000)
		for k := i; k < i+1000; k++ {
			kv = append(kv, "key:"+strconv.Itoa(k), k)
		}
		if err := c.MSet(ctx, kv...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	readyTimeout = time.Second
	began := time.Now()
	if err := s.Restart(); err != nil {
		t.Fatalf("Restart, after %v: %.300v", time.Since(began), err)
	}
	took := time.Since(began)
	if took < readyTimeout {
		t.Fatalf("the restart took %v, less than readyTimeout (%v): this test proves nothing", took, readyTimeout)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != keys {
		t.Fatalf("right after Restart returned (%v): DBSIZE = %d, %v; want %d", took, n, err, keys)
	}
	t.Logf("restarted in %v", took)
}
