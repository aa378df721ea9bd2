package cli_test

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
)

// acceptingHole listens on loopback, accepts connections and never answers
// them; accepted is signalled at the first connection, so that a test knows
// fence is connecting (and has its signal handler installed).
func acceptingHole(t *testing.T) (addr string, accepted <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			once.Do(func() { close(first) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String(), first
}

// TestExecInterruptedConnecting: SIGINT while fence exec is still
// connecting to ZooKeeper or etcd ends it at once with exit 130, as it does
// while it waits for a Redis lock. Before, with --zookeeper it went on
// waiting for a session until the session timeout (here 30 s) and then
// exited 2 "no session"; with --etcd it exited 2 "context canceled".
func TestExecInterruptedConnecting(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		args func(addr string) []string
	}{
		{"zookeeper", func(addr string) []string {
			return []string{"exec", "--zookeeper", addr, "--zookeeper-session-timeout", "30s", "x", "--", "true"}
		}},
		{"etcd", func(addr string) []string { return []string{"exec", "--etcd", "http://" + addr, "x", "--", "true"} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			interruptConnected(t, c.args)
		})
	}
}

// interruptConnected runs fence with args(addr), addr a hole that accepts
// connections and answers nothing, sends it sig (SIGINT if none is given)
// once it has connected, and fails the test unless it exits
// ExitInterrupted within 3 s. It returns what fence wrote to stderr.
func interruptConnected(t *testing.T, args func(addr string) []string, sig ...os.Signal) string {
	t.Helper()
	addr, accepted := acceptingHole(t)
	cmd := exec.Command(fenceBin, args(addr)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-accepted:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("fence never connected to %s", addr)
	}
	start := time.Now()
	send := os.Signal(os.Interrupt)
	if len(sig) > 0 {
		send = sig[0]
	}
	if err := cmd.Process.Signal(send); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if code, d := cmd.ProcessState.ExitCode(), time.Since(start); code != cli.ExitInterrupted || d > 3*time.Second {
		t.Errorf("exit %d %v after %v (stderr %q), want %d within 3 s", code, d.Round(time.Millisecond), send, stderr.String(), cli.ExitInterrupted)
	}
	return stderr.String()
}
