// Package redisserver starts real redis-server processes, for tests, the
// demo, the lab and the benchmarks, in the manner of net/http/httptest: each
// Start function returns a handle whose Close the caller must call (or
// register with t.Cleanup). Each server listens on a free loopback port,
// runs in its own directory, and is killed with the process that started it
// if that dies first. The package does not import testing, so binaries that
// use it do not link it; internal/redistest wraps it for tests.
//
// Beside the servers themselves, the package holds the steps of a failover
// that tests, the demo and the lab share: CutLink, Promote and Failover.
package redisserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fencekit/fence/internal/child"
	"github.com/fencekit/fence/internal/stopped"
	"github.com/redis/go-redis/v9"
)

// installHint names the install step in every failure about a missing binary.
const installHint = "install it with `apt-get install -y redis-server` (`make test` does this)"

// Server is one redis-server process.
type Server struct {
	Addr string // host:port on loopback
	Dir  string // the server's working directory
	TLS  *TLS   // the server's certificates if it speaks TLS alone (StartTLS), else nil

	bin     string
	args    []string
	ownsDir bool // Dir was made by Start; Close removes it

	mu     sync.Mutex
	proc   *os.Process       // nil while stopped
	exited chan struct{}     // closed when proc has exited
	state  **os.ProcessState // how proc exited, once exited is closed
	log    *os.File
}

// Start runs a redis-server without persistence (save "", no AOF) on a free
// loopback port in dir, and waits until it answers PING. If dir is empty it
// makes a temp dir, which Close removes. Extra arguments are appended to the
// command line, e.g. "--maxmemory", "1mb". A missing binary is reported with
// the step that installs it. The caller must Close the server.
func Start(dir string, extra ...string) (*Server, error) {
	return start(dir, nil, extra)
}

// start is Start, or StartTLS when t is not nil.
func start(dir string, t *TLS, extra []string) (*Server, error) {
	dir, owned, err := useDir(dir, "redis")
	if err != nil {
		return nil, err
	}
	s, err := launch(dir, t, func(port string) []string {
		listen := []string{"--port", port}
		if t != nil {
			listen = t.args(port)
		}
		return append(append(listen, "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir,
			"--daemonize", "no", "--repl-diskless-sync-delay", "0",
		), extra...)
	})
	if err != nil {
		if owned {
			_ = os.RemoveAll(dir)
		}
		return nil, err
	}
	s.ownsDir = owned
	return s, nil
}

// useDir returns dir, or a new temp dir (owned) if dir is empty.
func useDir(dir, pattern string) (string, bool, error) {
	if dir != "" {
		return dir, false, nil
	}
	dir, err := os.MkdirTemp("", "fence-"+pattern+"-")
	return dir, true, err
}

// launch starts redis-server with args(port) on a free port, trying again
// with another port if one was taken meanwhile. With t, the server speaks
// TLS alone, and its readiness is checked over TLS.
func launch(dir string, t *TLS, args func(port string) []string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found on PATH: %s", installHint)
	}
	s := &Server{Dir: dir, TLS: t, bin: bin}
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.args = args(strconv.Itoa(port))
		err = s.start()
		if err == nil {
			return s, nil
		}
		if attempt == 3 {
			return nil, err
		}
	}
}

// Host returns the host part of Addr.
func (s *Server) Host() string { h, _, _ := net.SplitHostPort(s.Addr); return h }

// Port returns the port part of Addr.
func (s *Server) Port() string { _, p, _ := net.SplitHostPort(s.Addr); return p }

// Client returns a go-redis client for the server (over TLS, trusting its
// CA, if it speaks TLS); the caller closes it.
func (s *Server) Client() *redis.Client { return redis.NewClient(s.options()) }

// TLSConfig returns a client's *tls.Config for the server: nil if it speaks
// plain TCP, else a new one trusting its CA.
func (s *Server) TLSConfig() *tls.Config {
	if s.TLS == nil {
		return nil
	}
	return s.TLS.ClientConfig()
}

func (s *Server) options() *redis.Options {
	return &redis.Options{Addr: s.Addr, TLSConfig: s.TLSConfig()}
}

// Close kills the server and removes its directory if Start made it.
// Closing twice does nothing more.
func (s *Server) Close() {
	s.Kill()
	if s.ownsDir {
		_ = os.RemoveAll(s.Dir)
	}
}

// Kill stops the server with SIGKILL, as a crash would, and waits for it to
// exit. Killing a stopped server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.Kill()
	<-s.exited
	_ = s.log.Close()
	s.proc = nil
}

// Restart kills the server and starts it again on the same port with the
// same arguments. Without persistence, it comes back empty.
func (s *Server) Restart() error {
	s.Kill()
	return s.start()
}

// Signal sends sig to the server process (SIGSTOP, SIGCONT, ...). It does
// nothing if the server is stopped. After SIGSTOP it returns once every
// thread of the server is stopped (see package stopped).
func (s *Server) Signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		_ = s.proc.Signal(sig)
		if sig == syscall.SIGSTOP {
			stopped.Wait(s.proc.Pid, stopped.Limit)
		}
	}
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	logPath := filepath.Join(s.Dir, "redis.log")
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = log, log
	child.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited, state := make(chan struct{}), new(*os.ProcessState)
	go func() { *state, _ = cmd.Process.Wait(); close(exited) }()
	err = waitReady(s.options(), exited, cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		<-exited
		_ = log.Close()
		out, _ := os.ReadFile(logPath)
		return fmt.Errorf("redis-server on %s did not start: %w\n%s", s.Addr, err, out)
	}
	s.proc, s.exited, s.state, s.log = cmd.Process, exited, state, log
	return nil
}

// Died reports how the server exited if it did without Kill or Close (a
// crash, a signal from elsewhere), with the end of its log; "" if it runs,
// or was stopped by Kill or Close. A test that fails on a server that
// refuses connections logs it (see redistest.Start).
func (s *Server) Died() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return ""
	}
	select {
	case <-s.exited:
	default:
		return ""
	}
	why := (*s.state).String()
	if out, err := os.ReadFile(filepath.Join(s.Dir, "redis.log")); err == nil {
		lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
		why += "; the end of its log:\n" + strings.Join(lines[max(0, len(lines)-10):], "\n")
	}
	return why
}

// readyTimeout is how long waitReady waits for a server to answer PING, and
// for a server that answers LOADING to load more of its data.
var readyTimeout = 10 * time.Second

// waitReady waits for the server to answer PING, or for it to exit. It
// waits up to readyTimeout, and longer while the server loads its data
// (PING answers LOADING) and makes progress: each readyTimeout in which
// it loaded more bytes of its RDB or AOF gives it another. A restarted
// server that has data loads it before it serves, and a big dataset (the
// million keys of TestRestartReturnsBeforeLoaded) took more than 10 s on
// a loaded machine: Restart failed with a server that was well on its
// way. One that stops making progress still fails after readyTimeout.
// The server that answers must be process pid (when INFO is there):
// freePort's port may have been taken meanwhile by another test's server,
// which answers PING while this one fails to bind and exits; a test handed
// that server would share it with the other test (and see its locks).
func waitReady(o *redis.Options, exited <-chan struct{}, pid int) error {
	// ContextTimeoutEnabled: a server that accepts but does not answer (a
	// load with no events between keys) held each PING for go-redis's
	// 3 s ReadTimeout past the deadline (TestRestartLoadingBounds: 5.1 s
	// with a readyTimeout of 500 ms).
	o.MaxRetries, o.DialTimeout, o.ContextTimeoutEnabled = -1, time.Second, true
	c := redis.NewClient(o)
	defer c.Close()
	until := time.Now().Add(readyTimeout)
	loaded := int64(-1) // loading_loaded_bytes last seen
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		ctx, cancel := context.WithDeadline(context.Background(), until)
		select {
		case <-exited:
			cancel()
			return errors.New("process exited")
		case <-ctx.Done():
			cancel()
			return ctx.Err()
		case <-retry.C:
		}
		err := c.Ping(ctx).Err()
		switch {
		case err == nil:
			info, err := c.Info(ctx, "server").Result()
			var reply redis.Error
			switch {
			case err == nil:
				cancel()
				if got := processID(info); got != pid {
					return fmt.Errorf("%w: process %d answers there, not %d", errPortTaken, got, pid)
				}
				return nil
			case errors.As(err, &reply):
				cancel()
				return nil // INFO renamed away (--rename-command): unchecked
			}
		case strings.HasPrefix(err.Error(), "LOADING"):
			// PING fails while the server loads its data; INFO does
			// not. Progress, by our process, earns more time.
			info, err := c.Info(ctx).Result()
			if err == nil && processID(info) == pid {
				if n := infoInt(info, "loading_loaded_bytes"); n > loaded {
					loaded = n
					until = time.Now().Add(readyTimeout)
				}
			}
		}
		cancel()
		retry.Reset(10 * time.Millisecond)
	}
}

// errPortTaken: another server listens on the port chosen.
var errPortTaken = errors.New("another server took the port")

// processID reads process_id from INFO's reply (0 if absent).
func processID(info string) int { return int(infoInt(info, "process_id")) }

// infoInt reads the integer field from INFO's reply (0 if absent).
func infoInt(info, field string) int64 {
	_, rest, _ := strings.Cut(info, "\n"+field+":")
	n, _ := strconv.ParseInt(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]), 10, 64)
	return n
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before the server binds it; launch then retries with a new one.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
