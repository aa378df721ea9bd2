// Package etcdserver starts real etcd servers, for tests and the lab, in the
// manner of internal/redisserver: each Start function returns a handle whose
// Close the caller must call (or register with t.Cleanup). The server is
// etcd's own, go.etcd.io/etcd/server/v3/embed, compiled into a small main
// (the etcdmain module beside this package, which alone requires the etcd
// server) and run as a child process, so that a test can kill it, pause it
// with SIGSTOP, or restart it from its data dir, without the race detector
// and out of goleak's view. Binary builds it once and caches it.
//
// Each member listens on free loopback ports, keeps its data in its own
// directory, does not fsync (unsafe-no-fsync), and is killed with the
// process that started it if that dies first. The package uses neither
// testing nor an etcd client: readiness and the leader are read from the
// members' HTTP endpoints (/health and /metrics).
package etcdserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fencekit/fence/internal/child"
	"github.com/fencekit/fence/internal/stopped"
)

// readyTimeout bounds the wait for members to serve.
const readyTimeout = 30 * time.Second

// Member is one etcd server process of a Cluster.
type Member struct {
	Name      string // the member's name, m0, m1, ...
	ClientURL string // http://127.0.0.1:port
	PeerURL   string // http://127.0.0.1:port
	Dir       string // the member's directory: config, log and data dir

	bin string

	mu     sync.Mutex
	proc   *os.Process   // nil while killed
	exited chan struct{} // closed when proc has exited
	log    *os.File
}

// Cluster is a set of etcd members that form one cluster; a standalone
// server is a cluster of one.
type Cluster struct {
	Members []*Member
	Dir     string // the parent of the members' directories

	ownsDir bool
}

// Start runs a standalone etcd server in dir (empty: a temp dir, removed by
// Close) and waits until it serves.
func Start(dir string) (*Cluster, error) { return StartCluster(dir, 1) }

// tokens makes initial-cluster-tokens unique within the process.
var tokens atomic.Int64

// StartCluster runs n members that form one cluster, each in a directory
// of its own under dir (empty: a temp dir, removed by Close), and waits
// until every member serves (GET /health says true). If a port was taken
// meanwhile, it starts over on new ports. The caller must Close the cluster.
func StartCluster(dir string, n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("etcdserver: %d members", n)
	}
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	owned := false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "fence-etcd-"); err != nil {
			return nil, err
		}
		owned = true
	}
	for attempt := 0; ; attempt++ {
		c, err := tryCluster(bin, dir, n, attempt)
		if err == nil {
			c.ownsDir = owned
			return c, nil
		}
		if attempt == 3 || !errors.Is(err, errPortTaken) {
			if owned {
				_ = os.RemoveAll(dir)
			}
			return nil, err
		}
	}
}

var errPortTaken = errors.New("address already in use")

// tryCluster starts the members on ports held until all were picked.
func tryCluster(bin, dir string, n, attempt int) (*Cluster, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir}
	var initial []string
	for i := range n {
		m := &Member{
			Name:      "m" + strconv.Itoa(i),
			ClientURL: "http://127.0.0.1:" + strconv.Itoa(ports[2*i]),
			PeerURL:   "http://127.0.0.1:" + strconv.Itoa(ports[2*i+1]),
			Dir:       filepath.Join(dir, fmt.Sprintf("m%d-%d", i, attempt)),
			bin:       bin,
		}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	token := fmt.Sprintf("fence-%d-%d-%d", os.Getpid(), time.Now().UnixNano(), tokens.Add(1))
	for _, m := range c.Members {
		if err := m.writeConfig(strings.Join(initial, ","), token); err != nil {
			return nil, err
		}
	}
	for _, m := range c.Members {
		if err := m.launch(); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.waitReady(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (m *Member) configPath() string { return filepath.Join(m.Dir, "etcd.yaml") }
func (m *Member) logPath() string    { return filepath.Join(m.Dir, "etcd.log") }

// DataDir returns the member's data dir.
func (m *Member) DataDir() string { return filepath.Join(m.Dir, "data") }

func (m *Member) writeConfig(initialCluster, token string) error {
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		return err
	}
	cfg := fmt.Sprintf(`name: %q
data-dir: %q
listen-client-urls: %q
advertise-client-urls: %q
listen-peer-urls: %q
initial-advertise-peer-urls: %q
initial-cluster: %q
initial-cluster-token: %q
initial-cluster-state: new
unsafe-no-fsync: true
logger: zap
log-level: warn
log-outputs: [stderr]
`, m.Name, m.DataDir(), m.ClientURL, m.ClientURL, m.PeerURL, m.PeerURL, initialCluster, token)
	return os.WriteFile(m.configPath(), []byte(cfg), 0o600)
}

// launch starts the member's process without waiting for it to serve.
func (m *Member) launch() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		return nil
	}
	log, err := os.OpenFile(m.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(m.bin, m.configPath())
	cmd.Dir = m.Dir
	cmd.Stdout, cmd.Stderr = log, log
	child.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("etcdserver: start %s: %w", m.Name, err)
	}
	exited := make(chan struct{})
	go func() { _, _ = cmd.Process.Wait(); close(exited) }()
	m.proc, m.exited, m.log = cmd.Process, exited, log
	return nil
}

// waitReady waits until every running member serves.
func (c *Cluster) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for _, m := range c.Members {
		if err := m.waitReady(ctx); err != nil {
			return err
		}
	}
	return nil
}

// WaitReady waits up to limit until the member serves: GET /health says
// true, which etcd answers only with a leader and a quorum.
func (m *Member) WaitReady(limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	return m.waitReady(ctx)
}

func (m *Member) waitReady(ctx context.Context) error {
	m.mu.Lock()
	exited := m.exited
	m.mu.Unlock()
	if exited == nil {
		return fmt.Errorf("etcdserver: %s is not running", m.Name)
	}
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-exited:
			out, _ := os.ReadFile(m.logPath())
			err := fmt.Errorf("etcdserver: %s (%s) exited before serving:\n%s", m.Name, m.ClientURL, tail(out))
			if strings.Contains(string(out), "address already in use") {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		case <-ctx.Done():
			out, _ := os.ReadFile(m.logPath())
			return fmt.Errorf("etcdserver: %s (%s) not serving: %w\n%s", m.Name, m.ClientURL, ctx.Err(), tail(out))
		case <-retry.C:
		}
		if body, err := m.get(ctx, "/health"); err == nil && strings.Contains(body, `"health":"true"`) {
			// (A member list that did not get through is asked again.)
			if err := m.checkOwn(ctx); err == nil || errors.Is(err, errPortTaken) {
				return err
			}
		}
		retry.Reset(20 * time.Millisecond)
	}
}

// tail returns the last lines of a log.
func tail(b []byte) string {
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

var httpClient = &http.Client{Timeout: time.Second}

// checkOwn checks that the server answering on m's client URL is a member
// of m's cluster: its member list has m's peer URL. The port may have been
// taken meanwhile by another test's etcd, which serves while m fails to
// bind and exits.
func (m *Member) checkOwn(ctx context.Context) error {
	body, err := m.send(ctx, http.MethodPost, "/v3/cluster/member/list", strings.NewReader("{}"))
	if err != nil {
		return fmt.Errorf("etcdserver: %s (%s): member list: %w", m.Name, m.ClientURL, err)
	}
	if !strings.Contains(body, strconv.Quote(m.PeerURL)) {
		return fmt.Errorf("%w: etcdserver: %s (%s) is another cluster's: its members are %s", errPortTaken, m.Name, m.ClientURL, body)
	}
	return nil
}

// get fetches path from the member's client URL.
func (m *Member) get(ctx context.Context, path string) (string, error) {
	return m.send(ctx, http.MethodGet, path, nil)
}

// send makes a request to the member's client URL and returns the body.
func (m *Member) send(ctx context.Context, method, path string, body io.Reader) (string, error) {
	req, err := http.NewRequestWithContext(ctx, method, m.ClientURL+path, body)
	if err != nil {
		return "", err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	if resp.StatusCode != http.StatusOK {
		return b.String(), fmt.Errorf("%s: %s", path, resp.Status)
	}
	return b.String(), sc.Err()
}

// IsLeader reports whether the member is running and says it is the
// leader (etcd_server_is_leader in /metrics).
func (m *Member) IsLeader(ctx context.Context) bool {
	if !m.Running() {
		return false
	}
	body, err := m.get(ctx, "/metrics")
	return err == nil && strings.Contains(body, "\netcd_server_is_leader 1\n")
}

// Running reports whether the member's process was started and not killed.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.proc != nil
}

// Endpoints returns the members' client URLs.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.ClientURL)
	}
	return out
}

// Leader returns the running member that says it is the leader, waiting up
// to limit for one (during an election there is none). Members in except
// are not asked: a member paused with SIGSTOP may still call itself leader.
func (c *Cluster) Leader(limit time.Duration, except ...*Member) (*Member, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("etcdserver: no leader within %v", limit)
		case <-retry.C:
		}
	next:
		for _, m := range c.Members {
			for _, x := range except {
				if m == x {
					continue next
				}
			}
			if m.IsLeader(ctx) {
				return m, nil
			}
		}
		retry.Reset(20 * time.Millisecond)
	}
}

// Kill stops the member with SIGKILL, as a crash would, and waits for it to
// exit. Killing a killed member does nothing.
func (m *Member) Kill() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return
	}
	_ = m.proc.Kill()
	<-m.exited
	_ = m.log.Close()
	m.proc = nil
}

// Stop pauses the member with SIGSTOP: it holds its ports and answers
// nothing until Cont. It returns once every thread of the member is
// stopped (up to stopped.Limit), not merely once the signal was sent: kill(2)
// returns with the signal pending, and on a loaded machine the member's
// threads may go on running, and answer a request sent meanwhile, until
// each is scheduled again and takes the signal.
func (m *Member) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return
	}
	_ = m.proc.Signal(syscall.SIGSTOP)
	stopped.Wait(m.proc.Pid, stopped.Limit)
}

// Cont resumes a member paused by Stop.
func (m *Member) Cont() { m.signal(syscall.SIGCONT) }

func (m *Member) signal(sig syscall.Signal) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		_ = m.proc.Signal(sig)
	}
}

// Restart kills the member and starts it again from its data dir on the
// same ports; it does not wait for it to serve (a member alone in a cluster
// of three cannot): see WaitReady.
func (m *Member) Restart() error {
	m.Kill()
	return m.launch()
}

// Restart kills every member and starts them again from their data dirs on
// the same ports, and waits until every member serves.
func (c *Cluster) Restart() error {
	for _, m := range c.Members {
		m.Kill()
	}
	for _, m := range c.Members {
		if err := m.launch(); err != nil {
			return err
		}
	}
	return c.waitReady()
}

// Close kills every member and removes the directory if StartCluster made
// it. Closing twice does nothing more.
func (c *Cluster) Close() {
	for _, m := range c.Members {
		m.Kill()
	}
	if c.ownsDir {
		_ = os.RemoveAll(c.Dir)
	}
}

// freePorts picks n distinct free loopback ports, holding each until all
// are picked so that none is picked twice. Another process may still take
// one before a member binds it; StartCluster then starts over.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("etcdserver: free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
