package redisserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartReplica starts a server in dir (empty: a temp dir) replicating
// primary. Call WaitReplicated before relying on it. The caller must Close
// it.
// A primary started with StartTLS gets a replica that speaks TLS, to it too.
func StartReplica(dir string, primary *Server, extra ...string) (*Server, error) {
	return start(dir, primary.TLS, append([]string{"--replicaof", primary.Host(), primary.Port()}, extra...))
}

// StartReplicated starts a primary and n replicas of it, each in a temp
// dir, and waits up to 30 s until the replicas really receive its writes
// (WaitReplicated). On failure it closes what it started. The caller must
// Close the servers.
func StartReplicated(n int) (primary *Server, replicas []*Server, err error) {
	if primary, err = Start(""); err != nil {
		return nil, nil, err
	}
	closeAll := func() {
		for _, r := range replicas {
			r.Close()
		}
		primary.Close()
	}
	for range n {
		r, err := StartReplica("", primary)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		replicas = append(replicas, r)
	}
	if err := WaitReplicated(primary, n, 30*time.Second); err != nil {
		closeAll()
		return nil, nil, err
	}
	return primary, replicas, nil
}

// WaitReplicated waits until n replicas of primary really receive writes,
// for up to limit. Redis 7.0 reports a replica online up to a second before
// writes reach it, so this writes a marker and waits until WAIT confirms n
// acknowledgements. A primary with min-replicas-to-write refuses the
// marker (NOREPLICAS) until enough replicas have connected: it is written
// again until then.
func WaitReplicated(primary *Server, n int, limit time.Duration) error {
	c := primary.Client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		done, err := markReplicated(ctx, c, n)
		if done {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%d replicas of %s not in sync after %v (%v)", n, primary.Addr, limit, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// markReplicated writes a marker on a connection of its own (WAIT counts
// the writes of its own connection) and waits up to 100 ms for n replicas
// to acknowledge it. done is false when the caller should try again: too
// few acknowledged, a primary with min-replicas-to-write refused the write
// until its replicas connect (what is awaited), or the connection was
// closed under it (Sentinel kills the normal clients of a replica it
// promotes or reconfigures, moments after the failover: "Conn is in a bad
// state: EOF" failed TestSentinelFailover once).
func markReplicated(ctx context.Context, c *redis.Client, n int) (done bool, err error) {
	conn := c.Conn()
	defer conn.Close()
	if err := conn.Set(ctx, "redisserver:marker", time.Now().UnixNano(), 0).Err(); err != nil {
		if redis.HasErrorPrefix(err, "NOREPLICAS") || isClosed(err) {
			return false, err
		}
		return true, fmt.Errorf("marker: %w", err)
	}
	acked, err := conn.Do(ctx, "WAIT", n, 100).Int()
	if err == nil && acked >= n {
		return true, conn.Del(ctx, "redisserver:marker").Err()
	}
	if err == nil {
		err = fmt.Errorf("acked %d", acked)
	}
	return false, err
}

// isClosed reports an error of a connection that the server closed.
func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || strings.Contains(err.Error(), "bad state")
}

// CutLink stops replica (SIGSTOP) and kills its link on primary, so that
// the primary's next writes reach neither it nor its socket buffers
// (stopping it alone would leave them in its socket). Only that replica's
// link is cut: the primary knows the link by the replica's local address,
// which the replica reports as laddr. The replica stays stopped until
// Promote or a SIGCONT continues it.
func CutLink(ctx context.Context, primary, replica *Server) error {
	rc := replica.Client()
	list, err := rc.ClientList(ctx).Result()
	_ = rc.Close()
	if err != nil {
		return fmt.Errorf("cut link: %w", err)
	}
	var laddr string
	for _, line := range strings.Split(list, "\n") {
		if !strings.Contains(line, "flags=M") {
			continue // not the link to its master
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "laddr="); ok {
				laddr = v
			}
		}
	}
	if laddr == "" {
		return fmt.Errorf("cut link: replica %s has no master link in CLIENT LIST", replica.Addr)
	}
	replica.Signal(syscall.SIGSTOP)
	pc := primary.Client()
	defer pc.Close()
	if err := pc.ClientKillByFilter(ctx, "ADDR", laddr).Err(); err != nil {
		return fmt.Errorf("cut link: %w", err)
	}
	return nil
}

// Promote continues replica if it was stopped and makes it a primary
// (REPLICAOF NO ONE), as a failover would.
func Promote(ctx context.Context, replica *Server) error {
	replica.Signal(syscall.SIGCONT)
	rc := replica.Client()
	defer rc.Close()
	if err := rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		return fmt.Errorf("promote %s: %w", replica.Addr, err)
	}
	return nil
}

// Failover kills primary (SIGKILL, a crash) and promotes replica, the steps
// of a failover that loses what the replica had not received.
func Failover(ctx context.Context, primary, replica *Server) error {
	primary.Kill()
	return Promote(ctx, replica)
}

// Sentinels are redis-sentinel processes monitoring one primary as Master.
type Sentinels struct {
	Master  string // the monitored master's name
	Servers []*Server
}

// StartSentinels starts n sentinels (redis-server --sentinel), each in a
// temp dir, monitoring primary as "mymaster" with quorum n/2+1, declaring
// it down after 1 s. Sentinels of a primary started with StartTLS speak
// TLS alone, to it and its replicas too. Extra arguments come last
// ("--tls-auth-clients", "yes" asks clients for certificates). The caller
// must Close them.
func StartSentinels(primary *Server, n int, extra ...string) (*Sentinels, error) {
	s := &Sentinels{Master: "mymaster"}
	for range n {
		srv, err := startSentinel(s.Master, primary, n/2+1, extra)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("sentinel: %w", err)
		}
		s.Servers = append(s.Servers, srv)
	}
	return s, nil
}

func startSentinel(master string, primary *Server, quorum int, extra []string) (*Server, error) {
	dir, _, err := useDir("", "sentinel")
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("sentinel monitor %s %s %s %d\n"+
		"sentinel down-after-milliseconds %[1]s 1000\n"+
		"sentinel failover-timeout %[1]s 3000\n"+
		"sentinel parallel-syncs %[1]s 2\n", master, primary.Host(), primary.Port(), quorum)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	srv, err := launch(dir, primary.TLS, func(port string) []string {
		listen := []string{"--port", port}
		if primary.TLS != nil {
			listen = primary.TLS.args(port)
		}
		args := append([]string{conf, "--sentinel"}, append(listen, "--bind", "127.0.0.1", "--daemonize", "no")...)
		return append(args, extra...)
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	srv.ownsDir = true
	return srv, nil
}

// Addrs returns the sentinels' addresses.
func (s *Sentinels) Addrs() []string { return addrs(s.Servers) }

// Close kills the sentinels and removes their directories.
func (s *Sentinels) Close() {
	for _, srv := range s.Servers {
		srv.Close()
	}
}

// WaitReady waits up to 60 s until every sentinel knows the replicas,
// connected to them and seeing their link to the primary up, and the other
// sentinels, so that a failover can be voted on and the sentinels' view of
// the replicas is settled.
func (s *Sentinels) WaitReady(replicas int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, srv := range s.Servers {
		c := redis.NewSentinelClient(srv.options())
		err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
			r, err1 := c.Replicas(ctx, s.Master).Result()
			o, err2 := c.Sentinels(ctx, s.Master).Result()
			return err1 == nil && err2 == nil && settledReplicas(r) >= replicas && len(o) >= len(s.Servers)-1,
				fmt.Errorf("sentinel %s sees %d replicas (%d settled: %v) and %d sentinels after 60s", srv.Addr, len(r), settledReplicas(r), r, len(o))
		})
		_ = c.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// settledReplicas counts the replicas of a SENTINEL REPLICAS reply that
// the sentinel is connected to, does not think down, and sees linked to
// their primary. A replica the sentinel just learnt of from the primary's
// INFO is listed before that, flagged disconnected.
func settledReplicas(replicas []map[string]string) int {
	n := 0
	for _, r := range replicas {
		flags := strings.Split(r["flags"], ",")
		if slices.Contains(flags, "disconnected") || slices.Contains(flags, "s_down") || slices.Contains(flags, "o_down") {
			continue
		}
		if r["master-link-status"] == "ok" {
			n++
		}
	}
	return n
}

// WaitFailover waits up to 60 s until the sentinels name a new master other
// than old, and returns it from candidates. It then sets every sentinel's
// down-after-milliseconds to 60 s, so that the wait is for one failover:
// at 1 s, a loaded machine that delays the new master's answers has the
// sentinels fail over again, to a replica that may have missed the
// writes made since (two CI runs: the first promoted server, a replica
// again, refused or lacked what the test had written there).
func (s *Sentinels) WaitFailover(old *Server, candidates ...*Server) (*Server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := redis.NewSentinelClient(s.Servers[0].options())
	defer c.Close()
	var found *Server
	err := poll(ctx, 100*time.Millisecond, func() (bool, error) {
		addr, err := c.GetMasterAddrByName(ctx, s.Master).Result()
		if err != nil || len(addr) != 2 || net.JoinHostPort(addr[0], addr[1]) == old.Addr {
			return false, fmt.Errorf("no failover after 60s: %v %v", addr, err)
		}
		for _, cand := range candidates {
			if cand.Addr == net.JoinHostPort(addr[0], addr[1]) {
				found = cand
				return true, nil
			}
		}
		return false, final{fmt.Errorf("sentinels promoted unknown %v", addr)}
	})
	if err != nil {
		return nil, err
	}
	// A majority is enough: a sentinel that missed it (a test paused it)
	// finds no quorum to agree that the new master is down.
	var held int
	var errs []error
	for _, srv := range s.Servers {
		sc := redis.NewSentinelClient(srv.options())
		err := sc.Set(ctx, s.Master, "down-after-milliseconds", "60000").Err()
		_ = sc.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("sentinel %s: %w", srv.Addr, err))
			continue
		}
		held++
	}
	if held <= len(s.Servers)/2 {
		return nil, fmt.Errorf("holding off a second failover: %w", errors.Join(errs...))
	}
	return found, nil
}

// Cluster is a Redis Cluster.
type Cluster struct {
	Servers  []*Server // the masters
	Replicas []*Server // their replicas, if any
}

// StartCluster starts n cluster-enabled servers in temp dirs, joins them
// with redis-cli --cluster create, and waits up to 30 s for cluster_state:ok
// on every node. The caller must Close it.
func StartCluster(n int) (*Cluster, error) { return StartClusterWithReplicas(n, 0) }

// StartClusterWithReplicas starts a cluster of n masters with replicas
// replicas each, and waits up to 30 s until cluster_state is ok on every
// node, every master's node table lists its replicas, and every replica
// really receives its master's writes. The caller must Close it.
func StartClusterWithReplicas(n, replicas int) (*Cluster, error) {
	return StartClusterTLS(nil, n, replicas)
}

// StartClusterTLS is StartClusterWithReplicas for nodes that speak TLS
// alone (see StartTLS), among themselves too (--tls-cluster yes); with t
// nil, plain TCP.
func StartClusterTLS(t *TLS, n, replicas int) (*Cluster, error) {
	c := &Cluster{}
	var all []*Server
	for range n * (1 + replicas) {
		args := []string{"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"}
		if t != nil {
			args = append(args, "--tls-cluster", "yes")
		}
		s, err := start("", t, args)
		if err != nil {
			c.Servers = all
			c.Close()
			return nil, err
		}
		all = append(all, s)
	}
	if err := c.create(all, replicas); err != nil {
		c.Servers = all
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) create(all []*Server, replicas int) error {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return fmt.Errorf("redis-cli not found on PATH: %s", installHint)
	}
	var args []string
	if t := all[0].TLS; t != nil {
		args = []string{"--tls", "--cacert", t.CAFile, "--cert", t.CertFile, "--key", t.KeyFile}
	}
	args = append(append(args, "--cluster", "create"), addrs(all)...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, s := range all {
		rc := s.Client()
		err := poll(ctx, 50*time.Millisecond, func() (bool, error) {
			info, err := rc.ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok"),
				fmt.Errorf("cluster not ok after 30s: %v %s", err, info)
		})
		var info string
		if err == nil {
			info, err = rc.Info(ctx, "replication").Result()
		}
		_ = rc.Close()
		if err != nil {
			return err
		}
		if strings.Contains(info, "role:master") {
			c.Servers = append(c.Servers, s)
		} else {
			c.Replicas = append(c.Replicas, s)
		}
	}
	if replicas > 0 {
		return c.replicated(ctx, replicas)
	}
	return nil
}

// replicated waits until every master's n replicas are listed in its node
// table and acknowledge a write.
func (c *Cluster) replicated(ctx context.Context, n int) error {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), TLSConfig: c.Servers[0].TLSConfig()})
	defer cc.Close()
	for _, m := range c.Servers {
		// A key that this master owns, written and waited for on one
		// connection (WAIT counts its own connection's writes).
		var node *redis.Client
		var key string
		for i := 0; node == nil || node.Options().Addr != m.Addr; i++ {
			key = fmt.Sprintf("redisserver:marker:%d", i)
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
		err = poll(ctx, 20*time.Millisecond, func() (bool, error) {
			listed, err := node.Do(ctx, "CLUSTER", "REPLICAS", id).StringSlice()
			return err == nil && len(listed) >= n,
				fmt.Errorf("%s lists %d replicas, want %d: %v", m.Addr, len(listed), n, err)
		})
		if err != nil {
			return err
		}
		conn := node.Conn()
		err = poll(ctx, 0, func() (bool, error) {
			if err := conn.Set(ctx, key, 1, 0).Err(); err != nil {
				return false, final{fmt.Errorf("marker on %s: %w", m.Addr, err)}
			}
			acked, err := conn.Do(ctx, "WAIT", n, 100).Int()
			return err == nil && acked >= n, fmt.Errorf("replicas of %s not in sync: acked %d, %v", m.Addr, acked, err)
		})
		if err == nil {
			err = conn.Del(ctx, key).Err()
		}
		_ = conn.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// MigrateSlot moves slot from one master of the cluster to another, key by
// key, as redis-cli --cluster reshard does: the target is set IMPORTING,
// the source MIGRATING, the slot's keys are moved with MIGRATE in batches,
// and then every master is told the slot's new owner. While it runs,
// clients of the slot meet ASK, TRYAGAIN and, once it is done, MOVED.
func (c *Cluster) MigrateSlot(ctx context.Context, slot int, from, to *Server) error {
	src, dst := from.Client(), to.Client()
	defer src.Close()
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
		n := s.Client()
		err := n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err()
		_ = n.Close()
		if err != nil {
			return fmt.Errorf("migrate slot %d: node %s: %w", slot, s.Addr, err)
		}
	}
	return nil
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string { return addrs(c.Servers) }

// Close kills the nodes and removes their directories.
func (c *Cluster) Close() {
	for _, s := range append(c.Servers, c.Replicas...) {
		s.Close()
	}
}

func addrs(servers []*Server) []string {
	var out []string
	for _, s := range servers {
		out = append(out, s.Addr)
	}
	return out
}

// poll calls check every interval until it reports done, and returns
// check's last error if ctx ends first, or at once if the error is final.
func poll(ctx context.Context, interval time.Duration, check func() (bool, error)) error {
	tick := time.NewTimer(0)
	defer tick.Stop()
	last := errors.New("no check before the deadline")
	for {
		select {
		case <-ctx.Done():
			return last
		case <-tick.C:
		}
		done, err := check()
		var f final
		switch {
		case done:
			return nil
		case errors.As(err, &f):
			return f.error
		}
		last = err
		tick.Reset(interval)
	}
}

// final marks an error of a poll check that waiting will not cure.
type final struct{ error }
