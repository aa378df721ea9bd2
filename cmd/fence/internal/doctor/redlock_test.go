package doctor_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/cmd/fence/internal/doctor"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// masters starts n durable, independent masters.
func masters(t *testing.T, n int) []*redistest.Server {
	t.Helper()
	out := make([]*redistest.Server, n)
	for i := range out {
		out[i] = redistest.Start(t, durable...)
	}
	return out
}

// redlockAt is the Config of a Redlock over addrs.
func redlockAt(addrs ...string) doctor.Config {
	var os []*redis.Options
	for _, a := range addrs {
		os = append(os, &redis.Options{Addr: a})
	}
	return doctor.Config{Redlock: os}
}

func addrsOf(servers []*redistest.Server) []string {
	var out []string
	for _, s := range servers {
		out = append(out, s.Addr)
	}
	return out
}

func TestRedlockClean(t *testing.T) {
	fs := run(t, redlockAt(addrsOf(masters(t, 3))...))
	if len(fs) != 0 {
		t.Fatalf("findings on a clean Redlock deployment:\n%s", dump(fs))
	}
}

func TestRedlockTooFew(t *testing.T) {
	ms := masters(t, 2)
	fs := run(t, redlockAt(addrsOf(ms)...))
	has(t, fs, "redlock-too-few", doctor.Warning, strings.Join(addrsOf(ms), ","))
	lacks(t, fs, "redlock-even") // two is too few, which says more
}

func TestRedlockEven(t *testing.T) {
	fs := run(t, redlockAt(addrsOf(masters(t, 4))...))
	f := has(t, fs, "redlock-even", doctor.Info, "")
	if !strings.Contains(f.Why, "tolerates 1 failure") {
		t.Fatalf("Why: %s", f.Why)
	}
	if len(fs) != 1 {
		t.Fatalf("more than redlock-even:\n%s", dump(fs))
	}
}

// One server listed twice, under the same address and under another
// (localhost for 127.0.0.1): either way it is not independent.
func TestRedlockSameServer(t *testing.T) {
	ms := masters(t, 2)
	fs := run(t, redlockAt(ms[0].Addr, ms[1].Addr, ms[0].Addr))
	has(t, fs, "redlock-not-independent", doctor.Critical, ms[0].Addr+","+ms[0].Addr)

	_, port, _ := net.SplitHostPort(ms[0].Addr)
	alias := net.JoinHostPort("localhost", port)
	fs = run(t, redlockAt(ms[0].Addr, ms[1].Addr, alias))
	has(t, fs, "redlock-not-independent", doctor.Critical, ms[0].Addr+","+alias)
}

// A master that replicates another: one replication group, and a replica
// where a master should be.
func TestRedlockReplicaOfAnother(t *testing.T) {
	ms := masters(t, 2)
	replica := redistest.StartReplica(t, ms[0], durable...)
	redistest.WaitReplicated(t, ms[0], 1)
	fs := run(t, redlockAt(ms[0].Addr, ms[1].Addr, replica.Addr))
	f := has(t, fs, "redlock-not-independent", doctor.Critical, "")
	if !strings.Contains(f.Node, ms[0].Addr) || !strings.Contains(f.Node, replica.Addr) || strings.Contains(f.Node, ms[1].Addr) {
		t.Fatalf("not-independent names %q, want %s and %s", f.Node, ms[0].Addr, replica.Addr)
	}
	has(t, fs, "not-primary", doctor.Critical, replica.Addr)
	has(t, fs, "redlock-replica", doctor.Warning, ms[0].Addr)
}

// Persistence off: each master is audited as a standalone one, and the
// Redlock finding states the stay-down rule with the lease time.
func TestRedlockRestartUnsafe(t *testing.T) {
	durableOnes := masters(t, 2)
	volatile := redistest.Start(t) // save "", appendonly no
	cfg := redlockAt(durableOnes[0].Addr, volatile.Addr, durableOnes[1].Addr)
	cfg.LeaseTime = 7 * time.Second
	fs := run(t, cfg)
	f := has(t, fs, "redlock-restart", doctor.Warning, volatile.Addr)
	if !strings.Contains(f.Why, "stays down at least the lease time (7s)") {
		t.Fatalf("Why does not state the stay-down rule: %s", f.Why)
	}
	has(t, fs, "persistence-off", doctor.Critical, volatile.Addr) // the standalone audit
	lacks(t, fs, "no-replicas")                                   // Redlock uses no replicas
}

func TestRedlockClockSkew(t *testing.T) {
	ms := masters(t, 3)
	// The clocks are read in the order given, after the rest: from the
	// third reading of the local clock on (the second master's TIME), the
	// local clock runs 5 s behind, which is what the second and third
	// masters' clocks 5 s ahead look like.
	var calls atomic.Int64
	cfg := redlockAt(addrsOf(ms)...)
	cfg.Now = func() time.Time {
		if calls.Add(1) > 2 {
			return time.Now().Add(-5 * time.Second)
		}
		return time.Now()
	}
	fs := run(t, cfg)
	f := has(t, fs, "clock-skew", doctor.Warning, "")
	if f.Node == ms[0].Addr || !strings.Contains(f.Why, ms[0].Addr) || !strings.Contains(f.Why, "Redlock") {
		t.Fatalf("skew finding %+v, want one against %s", f, ms[0].Addr)
	}
	if len(fs) != 1 {
		t.Fatalf("more than clock-skew:\n%s", dump(fs))
	}
}

// A master down: a finding while a majority answers; none answering is
// an error.
func TestRedlockMasterDown(t *testing.T) {
	ms := masters(t, 3)
	ms[2].Kill()
	fs := run(t, redlockAt(addrsOf(ms)...))
	has(t, fs, "node-unreachable", doctor.Warning, ms[2].Addr)
	lacks(t, fs, "redlock-no-majority")
	ms[1].Kill()
	fs = run(t, redlockAt(addrsOf(ms)...))
	has(t, fs, "redlock-no-majority", doctor.Critical, "")
}

func TestRedlockInvalidConfig(t *testing.T) {
	for _, cfg := range []doctor.Config{
		{Redlock: []*redis.Options{}},
		{Redlock: []*redis.Options{nil}},
		{Redlock: []*redis.Options{{Addr: "x:1"}}, Standalone: &redis.Options{Addr: "x:1"}},
	} {
		if _, err := doctor.Run(t.Context(), cfg); !errors.Is(err, fence.ErrInvalidOption) {
			t.Fatalf("Run(%+v) = %v, want ErrInvalidOption", cfg, err)
		}
	}
}

// A hung master takes at most a third of the time, and the others are
// audited meanwhile: it is a finding, not the end of the audit.
func TestRedlockHungMaster(t *testing.T) {
	ms := masters(t, 3)
	ms[1].Signal(syscall.SIGSTOP) // accepts connections (the kernel does), answers nothing
	t.Cleanup(func() { ms[1].Signal(syscall.SIGCONT) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	fs, err := doctor.Run(ctx, redlockAt(addrsOf(ms)...))
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("a hung master took %v of the 3 s", took)
	}
	has(t, fs, "node-unreachable", doctor.Warning, ms[1].Addr)
	lacks(t, fs, "redlock-no-majority")
	// All hung: the deployment could not be read, within the deadline.
	for _, m := range []*redistest.Server{ms[0], ms[2]} {
		m.Signal(syscall.SIGSTOP)
		t.Cleanup(func() { m.Signal(syscall.SIGCONT) })
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	start = time.Now()
	_, err = doctor.Run(ctx2, redlockAt(addrsOf(ms)...))
	if took := time.Since(start); took > 2*time.Second || !errors.Is(err, doctor.ErrUnreachable) {
		t.Fatalf("Run on hung masters: %v after %v", err, took)
	}
}

// A cluster node or a sentinel listed as a Redlock master: redlock sends
// plain commands to each master, so a cluster node answers MOVED for the
// locks whose slots it does not serve, and a sentinel refuses them all.
// Either is a critical finding on that node, named as what it is.
func TestRedlockNotStandalone(t *testing.T) {
	ms := masters(t, 2)
	cluster := redistest.StartCluster(t, 3)
	for _, s := range cluster.Servers {
		if err := s.Client(t).ConfigSet(context.Background(), "appendonly", "yes").Err(); err != nil {
			t.Fatal(err)
		}
		if err := s.Client(t).ConfigSet(context.Background(), "appendfsync", "always").Err(); err != nil {
			t.Fatal(err)
		}
	}
	node := cluster.Addrs()[0]
	f := has(t, run(t, redlockAt(ms[0].Addr, ms[1].Addr, node)), "redlock-not-standalone", doctor.Critical, node)
	if !strings.Contains(f.Why, "cluster") {
		t.Fatalf("Why does not say it is a cluster node: %s", f.Why)
	}

	primary := redistest.Start(t)
	sentinels := redistest.StartSentinels(t, primary, 1)
	redistest.WaitSentinelsReady(t, sentinels, 0)
	sent := sentinels.Addrs()[0]
	fs := run(t, redlockAt(ms[0].Addr, ms[1].Addr, sent))
	f = has(t, fs, "redlock-not-standalone", doctor.Critical, sent)
	if !strings.Contains(strings.ToLower(f.Why), "sentinel") {
		t.Fatalf("Why does not say it is a sentinel: %s", f.Why)
	}
	// One master that can grant among three answering: no majority, though
	// all three answer.
	has(t, run(t, redlockAt(ms[0].Addr, node, sent)), "redlock-no-majority", doctor.Critical, "")
}

// A master that refuses the credentials is not a master that "did not
// answer": the finding says it refused them, so the fix is the password,
// not the server, and prints no password.
func TestRedlockMasterRefusesAuth(t *testing.T) {
	ms := masters(t, 2)
	locked := redistest.Start(t, durable...)
	if err := locked.Client(t).ConfigSet(context.Background(), "requirepass", "s3cretpw").Err(); err != nil {
		t.Fatal(err)
	}
	cfg := redlockAt(ms[0].Addr, ms[1].Addr, locked.Addr)
	cfg.Redlock[2].Password = "wrongpw"
	f := has(t, run(t, cfg), "node-unreachable", doctor.Warning, locked.Addr)
	if !strings.Contains(f.Why, "WRONGPASS") || strings.Contains(f.Why, "did not answer") || strings.Contains(f.Why, "wrongpw") {
		t.Fatalf("Why: %s", f.Why)
	}
}
