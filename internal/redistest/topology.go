package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Host and Port split Addr.
func (s *Server) Host() string { h, _, _ := net.SplitHostPort(s.Addr); return h }

// Port returns the server's port.
func (s *Server) Port() string { _, p, _ := net.SplitHostPort(s.Addr); return p }

// StartReplica starts a server replicating primary. Call WaitReplicated
// before relying on it.
func StartReplica(t testing.TB, primary *Server, extra ...string) *Server {
	t.Helper()
	return Start(t, append([]string{"--replicaof", primary.Host(), primary.Port()}, extra...)...)
}

// WaitReplicated waits until n replicas of primary really receive writes.
// Redis 7.0 reports a replica online up to a second before writes reach it,
// so this writes a marker and waits until WAIT confirms n acknowledgements.
func WaitReplicated(t testing.TB, primary *Server, n int) {
	t.Helper()
	if err := Replicated(primary.Addr, n, 30*time.Second); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// Replicated is WaitReplicated for code without a testing.TB.
func Replicated(primary string, n int, limit time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: primary})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	conn := c.Conn() // WAIT counts the writes of its own connection
	defer conn.Close()
	for {
		if err := conn.Set(ctx, "redistest:marker", time.Now().UnixNano(), 0).Err(); err != nil {
			return fmt.Errorf("marker: %w", err)
		}
		acked, err := conn.Do(ctx, "WAIT", n, 100).Int()
		if err == nil && acked >= n {
			return conn.Del(ctx, "redistest:marker").Err()
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%d replicas of %s not in sync after %v (acked %d, %v)", n, primary, limit, acked, err)
		}
	}
}

// Sentinels are redis-sentinel processes monitoring one primary as Master.
type Sentinels struct {
	Master  string // the monitored master's name
	Servers []*Server
}

// Addrs returns the sentinels' addresses.
func (s *Sentinels) Addrs() []string {
	var out []string
	for _, srv := range s.Servers {
		out = append(out, srv.Addr)
	}
	return out
}

// StartSentinels starts n sentinels (redis-server --sentinel) monitoring
// primary as "mymaster" with quorum n/2+1, declaring it down after 1 s.
func StartSentinels(t testing.TB, primary *Server, n int) *Sentinels {
	t.Helper()
	s := &Sentinels{Master: "mymaster"}
	for range n {
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("sentinel monitor %s %s %s %d\n"+
			"sentinel down-after-milliseconds %[1]s 1000\n"+
			"sentinel failover-timeout %[1]s 3000\n"+
			"sentinel parallel-syncs %[1]s 2\n", s.Master, primary.Host(), primary.Port(), n/2+1)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		srv, err := launchSentinel(dir, conf)
		if err != nil {
			t.Fatalf("redistest: sentinel: %v", err)
		}
		t.Cleanup(srv.Kill)
		s.Servers = append(s.Servers, srv)
	}
	return s
}

func launchSentinel(dir, conf string) (*Server, error) {
	return launch(dir, func(port string) []string {
		return []string{conf, "--sentinel", "--port", port, "--bind", "127.0.0.1", "--daemonize", "no"}
	})
}

// Cluster is a Redis Cluster.
type Cluster struct {
	Servers  []*Server // the masters
	Replicas []*Server // their replicas, if any
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, s := range c.Servers {
		out = append(out, s.Addr)
	}
	return out
}

// StartCluster starts n cluster-enabled servers, joins them with
// redis-cli --cluster create, and waits for cluster_state:ok on every node.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartClusterWithReplicas(t, n, 0)
}

// StartClusterWithReplicas starts a cluster of n masters with replicas
// replicas each, and waits until cluster_state is ok on every node, every
// master's node table lists its replicas, and every replica really receives
// its master's writes.
func StartClusterWithReplicas(t testing.TB, n, replicas int) *Cluster {
	t.Helper()
	var all []*Server
	for range n * (1 + replicas) {
		all = append(all, Start(t, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"))
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli not found on PATH: %s", installHint)
	}
	args := []string{"--cluster", "create"}
	for _, s := range all {
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := &Cluster{}
	for _, s := range all {
		rc := redis.NewClient(&redis.Options{Addr: s.Addr})
		for {
			info, err := rc.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if ctx.Err() != nil {
				rc.Close()
				t.Fatalf("redistest: cluster not ok after 30s: %v %s", err, info)
			}
			wait := time.NewTimer(50 * time.Millisecond)
			<-wait.C
		}
		info, err := rc.Info(ctx, "replication").Result()
		rc.Close()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		if strings.Contains(info, "role:master") {
			c.Servers = append(c.Servers, s)
		} else {
			c.Replicas = append(c.Replicas, s)
		}
	}
	if replicas > 0 {
		if err := c.replicated(ctx, replicas); err != nil {
			t.Fatalf("redistest: %v", err)
		}
	}
	return c
}

// replicated waits until every master's n replicas acknowledge a write.
func (c *Cluster) replicated(ctx context.Context, n int) error {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer cc.Close()
	for _, m := range c.Servers {
		// A key that this master owns, written and waited for on one
		// connection (WAIT counts its own connection's writes).
		var node *redis.Client
		var key string
		for i := 0; node == nil || node.Options().Addr != m.Addr; i++ {
			key = fmt.Sprintf("redistest:marker:%d", i)
			var err error
			if node, err = cc.MasterForKey(ctx, key); err != nil {
				return err
			}
		}
		// The master's node table lists its replicas some gossip rounds
		// after they replicate: wait for that too.
		id, err := node.ClusterMyID(ctx).Result()
		if err != nil {
			return err
		}
		for {
			listed, err := node.Do(ctx, "CLUSTER", "REPLICAS", id).StringSlice()
			if err == nil && len(listed) >= n {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("%s lists %d replicas, want %d: %v", m.Addr, len(listed), n, err)
			}
			tick := time.NewTimer(20 * time.Millisecond)
			<-tick.C
		}
		conn := node.Conn()
		for {
			if err := conn.Set(ctx, key, 1, 0).Err(); err != nil {
				conn.Close()
				return fmt.Errorf("marker on %s: %w", m.Addr, err)
			}
			acked, err := conn.Do(ctx, "WAIT", n, 100).Int()
			if err == nil && acked >= n {
				err = conn.Del(ctx, key).Err()
				conn.Close()
				if err != nil {
					return err
				}
				break
			}
			if ctx.Err() != nil {
				conn.Close()
				return fmt.Errorf("replicas of %s not in sync: acked %d, %v", m.Addr, acked, err)
			}
		}
	}
	return nil
}

// WaitSentinelsReady waits until every sentinel knows the replicas and the
// other sentinels, so that a failover can be voted on.
func WaitSentinelsReady(t testing.TB, s *Sentinels, replicas int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, srv := range s.Servers {
		c := redis.NewSentinelClient(&redis.Options{Addr: srv.Addr})
		for {
			r, err1 := c.Replicas(ctx, s.Master).Result()
			o, err2 := c.Sentinels(ctx, s.Master).Result()
			if err1 == nil && err2 == nil && len(r) >= replicas && len(o) >= len(s.Servers)-1 {
				break
			}
			if ctx.Err() != nil {
				c.Close()
				t.Fatalf("redistest: sentinel %s sees %d replicas and %d sentinels after 60s", srv.Addr, len(r), len(o))
			}
			tick := time.NewTimer(100 * time.Millisecond)
			<-tick.C
		}
		c.Close()
	}
}

// WaitFailover waits until the sentinels name a new master other than old
// and returns it from candidates.
func WaitFailover(t testing.TB, s *Sentinels, old *Server, candidates ...*Server) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Servers[0].Addr})
	defer c.Close()
	for {
		addr, err := c.GetMasterAddrByName(ctx, s.Master).Result()
		if err == nil && len(addr) == 2 && net.JoinHostPort(addr[0], addr[1]) != old.Addr {
			for _, cand := range candidates {
				if cand.Addr == net.JoinHostPort(addr[0], addr[1]) {
					return cand
				}
			}
			t.Fatalf("redistest: sentinels promoted unknown %v", addr)
		}
		if ctx.Err() != nil {
			t.Fatalf("redistest: no failover after 60s: %v %v", addr, err)
		}
		tick := time.NewTimer(100 * time.Millisecond)
		<-tick.C
	}
}

// MigrateSlot moves slot from one master of the cluster to another, key by
// key, as redis-cli --cluster reshard does: the target is set IMPORTING,
// the source MIGRATING, the slot's keys are moved with MIGRATE in batches,
// and then every master is told the slot's new owner. While it runs,
// clients of the slot meet ASK, TRYAGAIN and, once it is done, MOVED.
func (c *Cluster) MigrateSlot(ctx context.Context, slot int, from, to *Server) error {
	src := redis.NewClient(&redis.Options{Addr: from.Addr})
	defer src.Close()
	dst := redis.NewClient(&redis.Options{Addr: to.Addr})
	defer dst.Close()
	srcID, err := src.ClusterMyID(ctx).Result()
	if err != nil {
		return fmt.Errorf("migrate slot %d: %w", slot, err)
	}
	dstID, err := dst.ClusterMyID(ctx).Result()
	if err != nil {
		return fmt.Errorf("migrate slot %d: %w", slot, err)
	}
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		return fmt.Errorf("migrate slot %d: importing: %w", slot, err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		return fmt.Errorf("migrate slot %d: migrating: %w", slot, err)
	}
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 10).Result()
		if err != nil {
			return fmt.Errorf("migrate slot %d: %w", slot, err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", to.Host(), to.Port(), "", 0, 5000, "REPLACE", "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("migrate slot %d: MIGRATE: %w", slot, err)
		}
	}
	// The target first, then the source, then the others: the order
	// redis-cli uses, so that no node points back at the source.
	for _, s := range append([]*Server{to, from}, c.Servers...) {
		n := redis.NewClient(&redis.Options{Addr: s.Addr})
		err := n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err()
		n.Close()
		if err != nil {
			return fmt.Errorf("migrate slot %d: node %s: %w", slot, s.Addr, err)
		}
	}
	return nil
}
