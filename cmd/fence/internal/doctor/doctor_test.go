package doctor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/cmd/fence/internal/doctor"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/refused"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// run audits the deployment cfg names, within 20 s, and logs the findings.
func run(t *testing.T, cfg doctor.Config) []doctor.Finding {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fs, err := doctor.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("doctor.Run: %v", err)
	}
	t.Logf("findings:\n%s", dump(fs))
	return fs
}

func standalone(s *redistest.Server) doctor.Config {
	return doctor.Config{Standalone: &redis.Options{Addr: s.Addr}}
}

// has fails the test unless fs holds a finding id of severity sev (on
// node, if node is not empty).
func has(t *testing.T, fs []doctor.Finding, id string, sev doctor.Severity, node string) doctor.Finding {
	t.Helper()
	for _, f := range fs {
		if f.ID == id && f.Severity == sev && (node == "" || f.Node == node) {
			return f
		}
	}
	t.Fatalf("no %s finding %q on %q in:\n%s", sev, id, node, dump(fs))
	return doctor.Finding{}
}

// eventually runs the doctor until fs holds finding id of severity sev on
// node, for up to 20 s: gossip and failure detection take their time.
func eventually(t *testing.T, cfg doctor.Config, id string, sev doctor.Severity, node string) []doctor.Finding {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		fs, err := doctor.Run(ctx, cfg)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(fs, func(f doctor.Finding) bool {
			return f.ID == id && f.Severity == sev && (node == "" || f.Node == node)
		}) {
			return fs
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s finding %q on %q after 20 s:\n%s", sev, id, node, dump(fs))
		}
		time.Sleep(200 * time.Millisecond) // polling with a deadline
	}
}

// lacks fails the test if fs holds a finding id.
func lacks(t *testing.T, fs []doctor.Finding, id string) {
	t.Helper()
	for _, f := range fs {
		if f.ID == id {
			t.Fatalf("unexpected finding %q in:\n%s", id, dump(fs))
		}
	}
}

func dump(fs []doctor.Finding) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, "  %s %s %s: %s\n", f.Severity, f.ID, f.Node, f.Why)
	}
	return b.String()
}

// durable are the arguments of a server that keeps every acquisition.
var durable = []string{"--appendonly", "yes", "--appendfsync", "always"}

// acquire takes and releases a lock through client, so that redislock
// writes its replica record as a real deployment's lockers do.
func acquire(t *testing.T, client redis.UniversalClient) {
	t.Helper()
	l, err := redislock.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, "doctor-test", fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// cleanPair starts a durable primary with one replica in sync, with
// min-replicas-to-write 1, and the replica record written.
func cleanPair(t *testing.T) (primary, replica *redistest.Server) {
	t.Helper()
	primary = redistest.Start(t, append(durable, "--min-replicas-to-write", "1")...)
	replica = redistest.StartReplica(t, primary, durable...)
	redistest.WaitReplicated(t, primary, 1)
	acquire(t, primary.Client(t))
	return primary, replica
}

func TestCleanDeployment(t *testing.T) {
	primary, _ := cleanPair(t)
	fs := run(t, standalone(primary))
	if len(fs) != 0 {
		t.Fatalf("findings on a clean deployment:\n%s", dump(fs))
	}
	if doctor.Worst(fs) != 0 {
		t.Fatal("Worst of no findings is not 0")
	}
}

func TestPersistenceOff(t *testing.T) {
	s := redistest.Start(t) // save "", appendonly no
	fs := run(t, standalone(s))
	f := has(t, fs, "persistence-off", doctor.Critical, s.Addr)
	if !strings.Contains(f.Why, "clock never goes backwards") {
		t.Fatalf("Why does not state the clock floor's assumption: %s", f.Why)
	}
	has(t, fs, "no-replicas", doctor.Info, s.Addr)
	acquire(t, s.Client(t)) // as no-replicas says: redislock's default needs no acknowledgement here
	if fs[0].Severity != doctor.Critical || doctor.Worst(fs) != doctor.Critical {
		t.Fatalf("findings not sorted most severe first:\n%s", dump(fs))
	}
}

func TestPersistenceSnapshotOnly(t *testing.T) {
	s := redistest.Start(t, "--save", "900 1")
	fs := run(t, standalone(s))
	has(t, fs, "persistence-snapshot", doctor.Warning, s.Addr)
	lacks(t, fs, "persistence-off")
}

func TestAppendfsyncWeak(t *testing.T) {
	s := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "everysec")
	fs := run(t, standalone(s))
	has(t, fs, "appendfsync", doctor.Warning, s.Addr)
	lacks(t, fs, "persistence-off")
}

func TestEviction(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "volatile-ttl"} {
		t.Run(policy, func(t *testing.T) {
			s := redistest.Start(t, append(durable, "--maxmemory", "64mb", "--maxmemory-policy", policy)...)
			has(t, run(t, standalone(s)), "eviction", doctor.Critical, s.Addr)
		})
	}
	t.Run("no maxmemory", func(t *testing.T) {
		s := redistest.Start(t, append(durable, "--maxmemory-policy", "allkeys-lru")...)
		lacks(t, run(t, standalone(s)), "eviction")
	})
}

func TestReplicasMissing(t *testing.T) {
	primary, replica := cleanPair(t)
	redistest.CutLink(t, primary, replica) // the record still expects it
	fs := run(t, standalone(primary))
	f := has(t, fs, "replicas-missing", doctor.Critical, primary.Addr)
	if !strings.Contains(f.Why, "0 of 1 expected") {
		t.Fatalf("Why: %s", f.Why)
	}
	// min-replicas-to-write 1 with none connected refuses every write too.
	has(t, fs, "min-replicas", doctor.Critical, primary.Addr)
}

func TestAcksUnmeetable(t *testing.T) {
	primary, _ := cleanPair(t)
	cfg := standalone(primary)
	cfg.ReplicaSync = redislock.ReplicaSync{Acks: 2}
	has(t, run(t, cfg), "acks-unmeetable", doctor.Critical, primary.Addr)
	cfg.ReplicaSync = redislock.ReplicaSync{Acks: redislock.AcksAll}
	lacks(t, run(t, cfg), "acks-unmeetable")
}

func TestExpectedReplicasOption(t *testing.T) {
	s := redistest.Start(t, durable...)
	cfg := standalone(s)
	cfg.ReplicaSync = redislock.ReplicaSync{Replicas: 1} // --replicas 1, and none there
	f := has(t, run(t, cfg), "replicas-missing", doctor.Critical, s.Addr)
	if !strings.Contains(f.Why, "0 of 1 expected") {
		t.Fatalf("Why: %s", f.Why)
	}
}

func TestReplicaSyncOff(t *testing.T) {
	primary, _ := cleanPair(t)
	cfg := standalone(primary)
	cfg.ReplicaSync = redislock.ReplicaSync{Disabled: true}
	has(t, run(t, cfg), "replica-sync-off", doctor.Warning, primary.Addr)
}

func TestReplicaBehind(t *testing.T) {
	primary, replica := cleanPair(t)
	replica.Signal(syscall.SIGSTOP) // its link stays up; its acknowledgements stop
	t.Cleanup(func() { replica.Signal(syscall.SIGCONT) })
	// The primary's lag figure grows by a second each second.
	fs := eventually(t, standalone(primary), "replica-behind", doctor.Warning, replica.Addr)
	// The paused replica does not answer the doctor either.
	has(t, fs, "node-unreachable", doctor.Warning, replica.Addr)
}

func TestMinReplicasUnmeetable(t *testing.T) {
	s := redistest.Start(t, append(durable, "--min-replicas-to-write", "1")...)
	has(t, run(t, standalone(s)), "min-replicas", doctor.Critical, s.Addr)
}

func TestMinReplicasZero(t *testing.T) {
	primary := redistest.Start(t, durable...)
	redistest.StartReplica(t, primary, durable...)
	redistest.WaitReplicated(t, primary, 1)
	acquire(t, primary.Client(t))
	cfg := standalone(primary)
	has(t, run(t, cfg), "min-replicas", doctor.Info, primary.Addr)
	cfg.ReplicaSync.Disabled = true
	has(t, run(t, cfg), "min-replicas", doctor.Warning, primary.Addr)
}

func TestNotPrimary(t *testing.T) {
	_, replica := cleanPair(t)
	has(t, run(t, standalone(replica)), "not-primary", doctor.Critical, replica.Addr)
}

func TestClockSkew(t *testing.T) {
	primary, replica := cleanPair(t)
	// The primary is read first; from the third reading of the local
	// clock on (the replica's TIME), the local clock runs 5 s behind,
	// which is what the replica's clock 5 s ahead looks like.
	var calls atomic.Int64
	cfg := standalone(primary)
	cfg.Now = func() time.Time {
		if calls.Add(1) > 2 {
			return time.Now().Add(-5 * time.Second)
		}
		return time.Now()
	}
	f := has(t, run(t, cfg), "clock-skew", doctor.Warning, replica.Addr)
	if !strings.Contains(f.Why, primary.Addr) {
		t.Fatalf("Why does not name the other node: %s", f.Why)
	}
	cfg.MaxSkew = 10 * time.Second
	calls.Store(0)
	lacks(t, run(t, cfg), "clock-skew")
}

func TestCommandRenamed(t *testing.T) {
	for _, cmd := range []string{"WAIT", "EVAL", "EVALSHA"} {
		t.Run(cmd, func(t *testing.T) {
			s := redistest.Start(t, append(durable, "--rename-command", cmd, "")...)
			f := has(t, run(t, standalone(s)), "command-missing", doctor.Critical, s.Addr)
			if !strings.HasPrefix(f.Why, cmd+" fails") {
				t.Fatalf("Why: %s", f.Why)
			}
		})
	}
}

func TestACL(t *testing.T) {
	s := redistest.Start(t, durable...)
	admin := s.Client(t)
	ctx := context.Background()
	for _, rule := range [][]any{
		{"ACL", "SETUSER", "nowait", "on", ">pw", "~*", "&*", "+@all", "-wait"},
		{"ACL", "SETUSER", "nopublish", "on", ">pw", "~*", "&*", "+@all", "-publish"},
		{"ACL", "SETUSER", "otherkeys", "on", ">pw", "~app:*", "&*", "+@all"},
		{"ACL", "SETUSER", "noadmin", "on", ">pw", "~*", "&*", "+@all", "-config", "-acl"},
		{"ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "&*", "+@all", "-info"},
		{"ACL", "SETUSER", "writeonly", "on", ">pw", "%W~*", "&*", "+@all"},
	} {
		if err := admin.Do(ctx, rule...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	as := func(user string) doctor.Config {
		return doctor.Config{Standalone: &redis.Options{Addr: s.Addr, Username: user, Password: "pw"}}
	}
	f := has(t, run(t, as("nowait")), "command-denied", doctor.Critical, s.Addr)
	if !strings.Contains(f.Why, "may not run WAIT on fence") {
		t.Fatalf("Why: %s", f.Why)
	}
	f = has(t, run(t, as("nopublish")), "command-denied", doctor.Critical, s.Addr)
	if !strings.Contains(f.Why, "may not run PUBLISH") {
		t.Fatalf("Why: %s", f.Why)
	}
	f = has(t, run(t, as("otherkeys")), "command-denied", doctor.Critical, s.Addr) // may not touch fence:* keys
	if !strings.Contains(f.Why, "DEL, EVAL, EVALSHA, EXISTS, GET, HDEL, HGET, HLEN, HSET, LINDEX, LLEN, LPOP, LRANGE, PEXPIRE, PTTL, RPUSH, SET ") {
		t.Fatalf("Why: %s", f.Why)
	}
	// The acquire script takes a free lock with SET NX GET, which reads the
	// key: a user allowed only to write fence's keys may not run it.
	f = has(t, run(t, as("writeonly")), "command-denied", doctor.Critical, s.Addr)
	if !strings.Contains(f.Why, "GET, HGET, LINDEX, LPOP, LRANGE, PTTL, SET on") {
		t.Fatalf("Why: %s", f.Why)
	}
	fs := run(t, as("noinfo"))
	lacks(t, fs, "command-missing")
	f = has(t, fs, "command-denied", doctor.Critical, s.Addr) // the replica record script reads INFO
	if !strings.Contains(f.Why, "may not run INFO") {
		t.Fatalf("Why: %s", f.Why)
	}
	fs = run(t, as("noadmin"))
	has(t, fs, "config-unreadable", doctor.Warning, s.Addr)
	has(t, fs, "acl-unchecked", doctor.Info, s.Addr)
	lacks(t, fs, "persistence-off")
}

func TestSentinel(t *testing.T) {
	primary, _ := cleanPair(t)
	sentinels := redistest.StartSentinels(t, primary, 3)
	redistest.WaitSentinelsReady(t, sentinels, 1)
	sa := sentinels.Addrs()
	cfg := doctor.Config{Sentinel: &redis.FailoverOptions{MasterName: sentinels.Master, SentinelAddrs: sa}}
	ctx := context.Background()

	// The launcher's sentinels declare the primary down after 1 s, well
	// within the 30 s lease time.
	fs := run(t, cfg)
	has(t, fs, "sentinel-down-after", doctor.Warning, sentinels.Master)
	lacks(t, fs, "sentinel-quorum")
	lacks(t, fs, "sentinel-unreachable")

	for _, addr := range sa {
		c := redis.NewSentinelClient(&redis.Options{Addr: addr})
		err := c.Set(ctx, sentinels.Master, "down-after-milliseconds", "40000").Err()
		_ = c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	if fs := run(t, cfg); len(fs) != 0 {
		t.Fatalf("findings on a clean Sentinel deployment:\n%s", dump(fs))
	}

	c := redis.NewSentinelClient(&redis.Options{Addr: sa[0]})
	defer c.Close()
	if err := c.Set(ctx, sentinels.Master, "quorum", "1").Err(); err != nil {
		t.Fatal(err)
	}
	has(t, run(t, cfg), "sentinel-quorum", doctor.Warning, sentinels.Master)

	sentinels.Servers[2].Close()
	has(t, run(t, cfg), "sentinel-unreachable", doctor.Warning, sentinels.Master)
	sentinels.Servers[1].Close() // one of three cannot authorise a failover
	has(t, run(t, cfg), "sentinel-unreachable", doctor.Critical, sentinels.Master)
}

func TestSentinelReplicaDown(t *testing.T) {
	primary, replica := cleanPair(t)
	sentinels := redistest.StartSentinels(t, primary, 1)
	redistest.WaitSentinelsReady(t, sentinels, 1)
	cfg := doctor.Config{Sentinel: &redis.FailoverOptions{MasterName: sentinels.Master, SentinelAddrs: sentinels.Addrs()}}
	lacks(t, run(t, cfg), "replica-down")
	replica.Kill()
	// The sentinel marks it down after down-after-milliseconds (1 s).
	fs := eventually(t, cfg, "replica-down", doctor.Warning, replica.Addr)
	has(t, fs, "replicas-missing", doctor.Critical, primary.Addr)
}

func TestSentinelNoQuorum(t *testing.T) {
	primary, _ := cleanPair(t)
	sentinels := redistest.StartSentinels(t, primary, 3)
	redistest.WaitSentinelsReady(t, sentinels, 1)
	cfg := doctor.Config{Sentinel: &redis.FailoverOptions{MasterName: sentinels.Master, SentinelAddrs: sentinels.Addrs()[:1]}}
	lacks(t, run(t, cfg), "sentinel-quorum")
	sentinels.Servers[1].Close()
	sentinels.Servers[2].Close()
	// Once the first sentinel sees the others down, CKQUORUM refuses.
	eventually(t, cfg, "sentinel-quorum", doctor.Critical, sentinels.Master)
}

func TestCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	addrs := cluster.Addrs()
	cfg := doctor.Config{Cluster: &redis.ClusterOptions{Addrs: addrs}}
	fs := run(t, cfg)
	for _, a := range addrs {
		has(t, fs, "cluster-replicas", doctor.Warning, a)
		has(t, fs, "persistence-off", doctor.Critical, a)
	}
	lacks(t, fs, "cluster-slots")

	ctx := context.Background()
	c := cluster.Servers[0].Client(t)
	if err := c.Do(ctx, "CLUSTER", "DELSLOTSRANGE", 0, 99).Err(); err != nil {
		t.Fatal(err)
	}
	// The other nodes learn of the uncovered slots by gossip.
	eventually(t, cfg, "cluster-slots", doctor.Critical, "")
}

// TestStandaloneClusterNode: a cluster node given as a standalone primary
// is named as such (a client of it alone gets MOVED; a wrapper of its
// cluster client is refused by redislock's replica sync).
func TestStandaloneClusterNode(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	node := cluster.Servers[0]
	has(t, run(t, standalone(node)), "standalone-cluster-node", doctor.Critical, node.Addr)
}

func TestClusterClean(t *testing.T) {
	cluster := redistest.StartClusterWithReplicas(t, 3, 1)
	ctx := context.Background()
	for _, s := range append(cluster.Servers, cluster.Replicas...) {
		if err := s.Client(t).ConfigSet(ctx, "appendonly", "yes").Err(); err != nil {
			t.Fatal(err)
		}
		for _, kv := range [][2]string{{"appendfsync", "always"}, {"min-replicas-to-write", "1"}} {
			if err := s.Client(t).ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Leases within the launcher's cluster-node-timeout (2 s), as a
	// cluster failing over that fast needs (TestClusterNodeTimeoutBelowLease).
	cfg := doctor.Config{Cluster: &redis.ClusterOptions{Addrs: cluster.Addrs()}, LeaseTime: 2 * time.Second}
	if fs := run(t, cfg); len(fs) != 0 {
		t.Fatalf("findings on a clean cluster:\n%s", dump(fs))
	}
	cluster.Replicas[0].Kill()
	// The masters flag it fail after cluster-node-timeout (2 s).
	eventually(t, cfg, "cluster-replicas", doctor.Warning, "")
}

func TestUnreachable(t *testing.T) {
	addr := refused.Addr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := doctor.Run(ctx, doctor.Config{Standalone: &redis.Options{Addr: addr}})
	if !errors.Is(err, doctor.ErrUnreachable) {
		t.Fatalf("Run on a closed port: %v", err)
	}
}

func TestHungServer(t *testing.T) {
	s := redistest.Start(t)
	s.Signal(syscall.SIGSTOP) // accepts connections (the kernel does), answers nothing
	t.Cleanup(func() { s.Signal(syscall.SIGCONT) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := doctor.Run(ctx, standalone(s))
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Run on a hung server took %v, past its 1 s deadline", took)
	}
	if !errors.Is(err, doctor.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run on a hung server: %v", err)
	}
}

func TestHungReplica(t *testing.T) {
	primary, replica := cleanPair(t)
	replica.Signal(syscall.SIGSTOP)
	t.Cleanup(func() { replica.Signal(syscall.SIGCONT) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	fs, err := doctor.Run(ctx, standalone(primary))
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("a hung replica took %v of the primary's 3 s", took)
	}
	has(t, fs, "node-unreachable", doctor.Warning, replica.Addr)
}

func TestInvalidConfig(t *testing.T) {
	for _, cfg := range []doctor.Config{
		{},
		{Standalone: &redis.Options{}, Cluster: &redis.ClusterOptions{}},
		{Sentinel: &redis.FailoverOptions{}},
		{Standalone: &redis.Options{}, LeaseTime: -time.Second},
	} {
		if _, err := doctor.Run(context.Background(), cfg); !errors.Is(err, fence.ErrInvalidOption) {
			t.Errorf("Run(%+v): %v", cfg, err)
		}
	}
}

// TestReplicaRecord: a fence:replicas record fence did not write is critical,
// and, as the finding says, acquisitions with replica sync on then fail.
func TestReplicaRecord(t *testing.T) {
	s := redistest.Start(t)
	c := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Set(ctx, "fence:replicas", "not fence's", 0).Err(); err != nil {
		t.Fatal(err)
	}
	f := has(t, run(t, standalone(s)), "replica-record", doctor.Critical, s.Addr)
	if !strings.Contains(f.Fix, "fence:replicas") {
		t.Fatalf("Fix does not name the key: %s", f.Fix)
	}
	l, err := redislock.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(ctx, "doctor-test", fence.TTL(time.Minute))
	var rec *redislock.ReplicaRecordError
	if !errors.As(err, &rec) {
		if lease != nil {
			_ = lease.Release(ctx)
		}
		t.Fatalf("acquire with a tampered replica record: %v, want a ReplicaRecordError", err)
	}
	if err := c.Del(ctx, "fence:replicas").Err(); err != nil {
		t.Fatal(err)
	}
	lacks(t, run(t, standalone(s)), "replica-record")
}
