// Package redistest starts real redis-server processes for tests: each on a
// free loopback port, in its own temp dir, stopped in t.Cleanup and killed
// with the test binary if that dies first. It wraps internal/redisserver,
// which code outside tests uses instead, so as not to link testing.
package redistest

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process. The embedded redisserver.Server gives
// it Addr, Dir, Host, Port, Kill and Signal.
type Server struct {
	*redisserver.Server
}

// Start runs a redis-server without persistence (save "", no AOF) on a free
// loopback port, waits until it answers PING, and stops it in t.Cleanup.
// Extra arguments are appended to the command line, e.g. "--maxmemory",
// "1mb". A missing binary fails the test with the install step.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	s, err := redisserver.Start(t.TempDir(), extra...)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(func() { logDied(t, s); s.Close() })
	return &Server{s}
}

// logDied logs, for a failed test to show, that s exited before the test
// ended without being killed by it, and how: a test that sees connections
// refused then tells a crash or a stray signal from its own doing.
func logDied(t testing.TB, s *redisserver.Server) {
	if why := s.Died(); why != "" {
		t.Logf("redistest: redis-server on %s exited before the test ended, not by Kill or Close: %s", s.Addr, why)
	}
}

// NewTLS makes a CA and a certificate for 127.0.0.1 in a temp dir of t's;
// see redisserver.NewTLS.
func NewTLS(t testing.TB) *redisserver.TLS {
	t.Helper()
	c, err := redisserver.NewTLS(t.TempDir())
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return c
}

// StartTLS is Start for a server that speaks TLS alone, with ca's
// certificate (see redisserver.StartTLS): its Client and TLSConfig speak
// TLS, and StartReplica and StartSentinels given it start TLS servers too.
// A redis-server built without TLS fails the test, naming why.
func StartTLS(t testing.TB, ca *redisserver.TLS, extra ...string) *Server {
	t.Helper()
	s, err := redisserver.StartTLS(t.TempDir(), ca, extra...)
	if err != nil {
		t.Fatalf("redistest: TLS: %v", err)
	}
	t.Cleanup(func() { logDied(t, s); s.Close() })
	return &Server{s}
}

// Launch is Start for code without a testing.TB, such as TestMain: it runs
// the server in dir, and the caller must Kill it.
func Launch(dir string, extra ...string) (*Server, error) {
	s, err := redisserver.Start(dir, extra...)
	if err != nil {
		return nil, err
	}
	return &Server{s}, nil
}

// Client returns a go-redis client for the server, closed in t.Cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := s.Server.Client()
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Restart kills the server and starts it again on the same port with the
// same arguments. Without persistence, it comes back empty.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.Server.Restart(); err != nil {
		t.Fatalf("redistest: restart: %v", err)
	}
}

// Relaunch is Restart for code without a testing.TB.
func (s *Server) Relaunch() error { return s.Server.Restart() }

// Pause stops the server with SIGSTOP (it returns once every thread is
// stopped) and returns resume, which sends SIGCONT once; t.Cleanup resumes
// it if the test has not.
func (s *Server) Pause(t testing.TB) (resume func()) {
	t.Helper()
	s.Signal(syscall.SIGSTOP)
	var once sync.Once
	resume = func() { once.Do(func() { s.Signal(syscall.SIGCONT) }) }
	t.Cleanup(resume)
	return resume
}

// StartReplica starts a server replicating primary (over TLS if primary
// speaks TLS). Call WaitReplicated before relying on it.
func StartReplica(t testing.TB, primary *Server, extra ...string) *Server {
	t.Helper()
	s, err := redisserver.StartReplica(t.TempDir(), primary.Server, extra...)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(func() { logDied(t, s); s.Close() })
	return &Server{s}
}

// WaitReplicated waits until n replicas of primary really receive writes;
// see redisserver.WaitReplicated.
func WaitReplicated(t testing.TB, primary *Server, n int) {
	t.Helper()
	if err := redisserver.WaitReplicated(primary.Server, n, 30*time.Second); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// Replicated is WaitReplicated for code without a testing.TB, given the
// primary's address.
func Replicated(primary string, n int, limit time.Duration) error {
	return redisserver.WaitReplicated(&redisserver.Server{Addr: primary}, n, limit)
}

// Sentinels are redis-sentinel processes monitoring one primary as Master.
type Sentinels struct {
	Master  string // the monitored master's name
	Servers []*Server
	s       *redisserver.Sentinels
}

// Addrs returns the sentinels' addresses.
func (s *Sentinels) Addrs() []string { return s.s.Addrs() }

// StartSentinels starts n sentinels (redis-server --sentinel) monitoring
// primary as "mymaster" with quorum n/2+1, declaring it down after 1 s.
// Extra arguments come last (see redisserver.StartSentinels). They are
// stopped in t.Cleanup.
func StartSentinels(t testing.TB, primary *Server, n int, extra ...string) *Sentinels {
	t.Helper()
	rs, err := redisserver.StartSentinels(primary.Server, n, extra...)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(rs.Close)
	s := &Sentinels{Master: rs.Master, s: rs}
	for _, srv := range rs.Servers {
		s.Servers = append(s.Servers, &Server{srv})
	}
	return s
}

// WaitSentinelsReady waits until every sentinel knows the replicas and the
// other sentinels, so that a failover can be voted on.
func WaitSentinelsReady(t testing.TB, s *Sentinels, replicas int) {
	t.Helper()
	if err := s.s.WaitReady(replicas); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// WaitFailover waits until the sentinels name a new master other than old
// and returns it from candidates.
func WaitFailover(t testing.TB, s *Sentinels, old *Server, candidates ...*Server) *Server {
	t.Helper()
	var inner []*redisserver.Server
	for _, c := range candidates {
		inner = append(inner, c.Server)
	}
	found, err := s.s.WaitFailover(old.Server, inner...)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	for _, c := range candidates {
		if c.Server == found {
			return c
		}
	}
	panic("redistest: WaitFailover returned no candidate") // unreachable
}

// Cluster is a Redis Cluster.
type Cluster struct {
	Servers  []*Server // the masters
	Replicas []*Server // their replicas, if any
	c        *redisserver.Cluster
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string { return c.c.Addrs() }

// StartCluster starts n cluster-enabled servers, joins them with
// redis-cli --cluster create, and waits for cluster_state:ok on every node.
// The nodes are stopped in t.Cleanup.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartClusterWithReplicas(t, n, 0)
}

// StartClusterWithReplicas starts a cluster of n masters with replicas
// replicas each; see redisserver.StartClusterWithReplicas. The nodes are
// stopped in t.Cleanup.
func StartClusterWithReplicas(t testing.TB, n, replicas int) *Cluster {
	t.Helper()
	rc, err := redisserver.StartClusterWithReplicas(n, replicas)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(rc.Close)
	c := &Cluster{c: rc}
	for _, s := range rc.Servers {
		c.Servers = append(c.Servers, &Server{s})
	}
	for _, s := range rc.Replicas {
		c.Replicas = append(c.Replicas, &Server{s})
	}
	return c
}

// StartClusterTLS is StartClusterWithReplicas for nodes that speak TLS
// alone, with ca's certificate; see redisserver.StartClusterTLS.
func StartClusterTLS(t testing.TB, ca *redisserver.TLS, n, replicas int) *Cluster {
	t.Helper()
	rc, err := redisserver.StartClusterTLS(ca, n, replicas)
	if err != nil {
		t.Fatalf("redistest: TLS cluster: %v", err)
	}
	t.Cleanup(rc.Close)
	c := &Cluster{c: rc}
	for _, s := range rc.Servers {
		c.Servers = append(c.Servers, &Server{s})
	}
	for _, s := range rc.Replicas {
		c.Replicas = append(c.Replicas, &Server{s})
	}
	return c
}

// MigrateSlot moves slot from one master to another; see
// redisserver.Cluster.MigrateSlot.
func (c *Cluster) MigrateSlot(ctx context.Context, slot int, from, to *Server) error {
	return c.c.MigrateSlot(ctx, slot, from.Server, to.Server)
}

// CutLink stops replica and kills its link to primary, so that the
// primary's next writes do not reach it; see redisserver.CutLink. The
// replica is continued in t.Cleanup if nothing continued it before.
func CutLink(t testing.TB, primary, replica *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := redisserver.CutLink(ctx, primary.Server, replica.Server); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(func() { replica.Signal(syscall.SIGCONT) })
}

// Failover kills primary and promotes replica; see redisserver.Failover.
func Failover(t testing.TB, primary, replica *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := redisserver.Failover(ctx, primary.Server, replica.Server); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}
