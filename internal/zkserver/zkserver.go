// Package zkserver starts real ZooKeeper servers, for tests and the lab, in
// the manner of internal/redisserver: a standalone server or an ensemble,
// each server a JVM that is the caller's own child (killed with it if it
// dies first), listening on free loopback ports, in its own directory. The
// package does not import testing and has no dependencies beyond the
// standard library.
//
// It runs the jars of Debian's libzookeeper-java (the zookeeper package
// without its service) on any Java on PATH; `make deps` installs both.
package zkserver

import (
	"bufio"
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
)

// Jar and SLF4J are the jars the servers run: ZooKeeper (its manifest lists
// the jars it needs) and the simple SLF4J binding, without which it logs
// nothing.
const (
	Jar   = "/usr/share/java/zookeeper.jar"
	SLF4J = "/usr/share/java/slf4j-simple.jar"
)

// installHint names the install step in every failure about a missing jar or
// java.
const installHint = "install it with `apt-get install -y --no-install-recommends libzookeeper-java default-jre-headless` (`make deps` does this)"

// jvmFlags keep each server small and quick to start: ≈ 55 MiB, ready in
// about a second.
var jvmFlags = []string{
	"-Xms16m", "-Xmx64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
	"-Djava.net.preferIPv4Stack=true",
}

// TickTime is the servers' tick: sessions may time out after 2 to 20 ticks,
// 1 s to 10 s.
const TickTime = 500 * time.Millisecond

// readyTimeout bounds the wait for a server (or a whole ensemble) to serve.
const readyTimeout = 30 * time.Second

// Server is one ZooKeeper server process.
type Server struct {
	Addr string // client address, host:port on loopback
	ID   int    // myid in an ensemble; 0 when standalone
	Dir  string // the server's directory: zoo.cfg, data/, zookeeper.log

	java     string
	ownedDir bool   // standalone: Close removes rootDir
	rootDir  string // the directory Start was given or made

	mu     sync.Mutex
	proc   *os.Process   // nil while killed
	exited chan struct{} // closed when proc has exited
	log    *os.File
}

// Ensemble is a set of servers that form one quorum.
type Ensemble struct {
	Servers []*Server
	dir     string
	ownsDir bool
	startup time.Duration // how long the last launch took to serve
}

// ElectionLimit is how long to wait for a leader after a change: 10 s, or
// twice what the ensemble took to start when that is longer. On a machine
// loaded by other jobs the JVMs are slow at both, and an election that
// took longer than a fixed limit there is not a failure.
func (e *Ensemble) ElectionLimit() time.Duration {
	return max(10*time.Second, 2*e.startup)
}

// Start runs a standalone server in dir (a temp dir if empty, which Close
// removes), with config's lines added to its zoo.cfg
// ("maxSessionTimeout=30000", say), and waits until it serves (`srvr`
// shows its mode). The caller must Close it.
func Start(dir string, config ...string) (*Server, error) {
	e, err := start(dir, 1, config)
	if err != nil {
		return nil, err
	}
	s := e.Servers[0]
	return s, nil
}

// StartEnsemble runs n servers (3 or 5, say) that form one ensemble, each
// in a directory of its own under dir (a temp dir if empty, which Close
// removes), and waits until each serves as leader or follower. The caller
// must Close the ensemble.
func StartEnsemble(dir string, n int) (*Ensemble, error) {
	if n < 2 {
		return nil, fmt.Errorf("zkserver: an ensemble needs at least 2 servers, not %d", n)
	}
	return start(dir, n, nil)
}

// start launches n servers (n == 1: standalone), retrying with new ports if
// one was taken meanwhile.
func start(dir string, n int, config []string) (*Ensemble, error) {
	java, err := findJava()
	if err != nil {
		return nil, err
	}
	owned := false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "fence-zk-"); err != nil {
			return nil, err
		}
		owned = true
	}
	for attempt := 0; ; attempt++ {
		began := time.Now()
		e, err := launch(java, dir, n, attempt, config)
		if err == nil {
			e.dir, e.ownsDir, e.startup = dir, owned, time.Since(began)
			if n == 1 {
				e.Servers[0].ownedDir = owned
				e.Servers[0].rootDir = dir
			}
			return e, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			if owned {
				_ = os.RemoveAll(dir)
			}
			return nil, err
		}
	}
}

// findJava checks for the jars and java, naming the install step.
func findJava() (string, error) {
	for _, jar := range []string{Jar, SLF4J} {
		if _, err := os.Stat(jar); err != nil {
			return "", fmt.Errorf("zkserver: %s missing: %s", jar, installHint)
		}
	}
	java, err := exec.LookPath("java")
	if err != nil {
		return "", fmt.Errorf("zkserver: java not found on PATH: %s", installHint)
	}
	return java, nil
}

// errPortTaken marks a server that could not bind a port picked for it.
var errPortTaken = errors.New("port taken")

// launch writes the configurations of n servers on ports picked together and
// starts them; on failure it kills what it started.
func launch(java, dir string, n, attempt int, config []string) (*Ensemble, error) {
	ports, err := freePorts(3 * n) // client, quorum and election port per server
	if err != nil {
		return nil, err
	}
	e := &Ensemble{}
	var quorum []string
	if n > 1 {
		for i := range n {
			quorum = append(quorum, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", i+1, ports[3*i+1], ports[3*i+2]))
		}
	}
	for i := range n {
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[3*i])), java: java, Dir: dir}
		if n > 1 {
			s.ID = i + 1
			s.Dir = filepath.Join(dir, fmt.Sprintf("zk%d-%d", s.ID, attempt))
		}
		if err := s.writeConfig(quorum, config); err != nil {
			return nil, err
		}
		e.Servers = append(e.Servers, s)
	}
	for _, s := range e.Servers {
		if err := s.launch(); err != nil {
			e.kill()
			return nil, err
		}
	}
	if err := e.waitReady(); err != nil {
		e.kill()
		return nil, err
	}
	return e, nil
}

func (s *Server) dataDir() string { return filepath.Join(s.Dir, "data") }

func (s *Server) writeConfig(quorum, config []string) error {
	data := s.dataDir()
	if err := os.MkdirAll(data, 0o700); err != nil {
		return err
	}
	cfg := []string{
		"tickTime=" + strconv.Itoa(int(TickTime/time.Millisecond)),
		"initLimit=10",
		"syncLimit=5",
		"dataDir=" + data,
		"clientPort=" + s.Port(),
		"clientPortAddress=127.0.0.1",
		"maxClientCnxns=0",
		"admin.enableServer=false",
		"4lw.commands.whitelist=*",
		"forceSync=no",
	}
	if len(quorum) > 0 {
		cfg = append(cfg, "standaloneEnabled=false")
		cfg = append(cfg, quorum...)
		if err := os.WriteFile(filepath.Join(data, "myid"), []byte(strconv.Itoa(s.ID)+"\n"), 0o600); err != nil {
			return err
		}
	}
	cfg = append(cfg, config...)
	return os.WriteFile(s.cfgPath(), []byte(strings.Join(cfg, "\n")+"\n"), 0o600)
}

func (s *Server) cfgPath() string { return filepath.Join(s.Dir, "zoo.cfg") }
func (s *Server) logPath() string { return filepath.Join(s.Dir, "zookeeper.log") }

// launch starts the JVM; it does not wait for it to serve.
func (s *Server) launch() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	log, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	args := append(append([]string{}, jvmFlags...),
		"-cp", Jar+":"+SLF4J,
		"org.apache.zookeeper.server.quorum.QuorumPeerMain", s.cfgPath())
	cmd := exec.Command(s.java, args...)
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = log, log
	child.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("zkserver: start java: %w", err)
	}
	exited := make(chan struct{})
	go func() { _, _ = cmd.Process.Wait(); close(exited) }()
	s.proc, s.exited, s.log = cmd.Process, exited, log
	return nil
}

// waitReady waits until every server serves, or one exits.
func (e *Ensemble) waitReady() error {
	limit := time.Now().Add(readyTimeout)
	for _, s := range e.Servers {
		if err := s.waitReady(limit); err != nil {
			return err
		}
	}
	return nil
}

// waitReady waits until `srvr` shows the server's mode, until limit.
func (s *Server) waitReady(limit time.Time) error {
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	for {
		if mode, err := s.Mode(); err == nil && mode != "" {
			// The server that answers must be this one: the port may
			// have been taken meanwhile by another test's server, which
			// serves while this one fails to bind. (A conf that did not
			// get through is asked again.)
			if err := s.checkOwn(); err == nil || errors.Is(err, errPortTaken) {
				return err
			}
		}
		select {
		case <-exited:
			out, _ := os.ReadFile(s.logPath())
			if strings.Contains(string(out), "BindException") || strings.Contains(string(out), "Address already in use") {
				return fmt.Errorf("zkserver: %s: %w", s.Addr, errPortTaken)
			}
			return fmt.Errorf("zkserver: server %s exited before serving:\n%s", s.Addr, tail(out))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(limit) {
			out, _ := os.ReadFile(s.logPath())
			return fmt.Errorf("zkserver: server %s not serving after %v:\n%s", s.Addr, readyTimeout, tail(out))
		}
	}
}

// checkOwn checks that the server answering on s.Addr runs on s's data
// directory (conf reports dataDir with ZooKeeper's version-2 added).
func (s *Server) checkOwn() error {
	out, err := s.Command("conf")
	if err != nil {
		return fmt.Errorf("zkserver: %s: conf: %w", s.Addr, err)
	}
	data := s.dataDir()
	for line := range strings.SplitSeq(out, "\n") {
		if dir, ok := strings.CutPrefix(line, "dataDir="); ok {
			if dir = strings.TrimSpace(dir); dir == data || strings.HasPrefix(dir, data+"/") {
				return nil
			}
			return fmt.Errorf("zkserver: %s: %w: it serves %s, not %s", s.Addr, errPortTaken, dir, data)
		}
	}
	// This package's servers allow every four-letter command: one that
	// refuses conf is another's.
	return fmt.Errorf("zkserver: %s: %w: conf names no dataDir:\n%s", s.Addr, errPortTaken, out)
}

// tail returns the end of a log, for error messages.
func tail(b []byte) string {
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// Command sends a four-letter command (srvr, stat, mntr, ...) to the server
// and returns its reply.
func (s *Server) Command(cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(cmd)); err != nil {
		return "", err
	}
	var b strings.Builder
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	return b.String(), sc.Err()
}

// Mode returns the server's mode as `srvr` reports it: standalone, leader
// or follower. It is "" (with a nil error) while the server does not serve,
// as during an election.
func (s *Server) Mode() (string, error) {
	out, err := s.Command("srvr")
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(out, "\n") {
		if m, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(m), nil
		}
	}
	return "", nil
}

// Port returns the port part of Addr.
func (s *Server) Port() string { _, p, _ := net.SplitHostPort(s.Addr); return p }

// Kill stops the server with SIGKILL, as a crash would, and waits for it to
// exit. Killing a killed server does nothing.
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

// Stop pauses the server (SIGSTOP): it holds its connections open and
// answers nothing, as a hung server would. It returns once every thread of
// the server is stopped (see package stopped). Cont resumes it.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		_ = s.proc.Signal(syscall.SIGSTOP)
		stopped.Wait(s.proc.Pid, stopped.Limit)
	}
}

// Cont resumes a server paused by Stop.
func (s *Server) Cont() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		_ = s.proc.Signal(sig)
	}
}

// Restart starts a killed server again with the same configuration and
// data, and waits until it serves (in an ensemble: until it has rejoined).
func (s *Server) Restart() error {
	s.Kill()
	if err := s.launch(); err != nil {
		return err
	}
	if err := s.waitReady(time.Now().Add(readyTimeout)); err != nil {
		s.Kill()
		return err
	}
	return nil
}

// Close kills a server that Start started and removes the directory Start
// made. Closing twice does nothing more. (Servers of an ensemble are closed
// with the ensemble.)
func (s *Server) Close() {
	s.Kill()
	if s.ownedDir {
		_ = os.RemoveAll(s.rootDir)
	}
}

// Addrs returns the client addresses of the ensemble's servers.
func (e *Ensemble) Addrs() []string {
	var addrs []string
	for _, s := range e.Servers {
		addrs = append(addrs, s.Addr)
	}
	return addrs
}

// Leader returns the server whose `srvr` says it leads, waiting up to limit
// for an election to end.
func (e *Ensemble) Leader(limit time.Duration) (*Server, error) {
	end := time.Now().Add(limit)
	for {
		for _, s := range e.Servers {
			if mode, err := s.Mode(); err == nil && mode == "leader" {
				return s, nil
			}
		}
		if time.Now().After(end) {
			return nil, fmt.Errorf("zkserver: no leader after %v", limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *Ensemble) kill() {
	for _, s := range e.Servers {
		s.Kill()
	}
}

// Close kills every server and removes the directory StartEnsemble made.
func (e *Ensemble) Close() {
	e.kill()
	if e.ownsDir {
		_ = os.RemoveAll(e.dir)
	}
}

// freePorts picks n distinct free loopback ports, holding each until all
// are picked so that none is handed out twice. Another process may still
// take one before a server binds it; start then retries with new ones.
func freePorts(n int) ([]int, error) {
	var ports []int
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("zkserver: free port: %w", err)
		}
		held = append(held, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
