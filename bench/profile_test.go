package main

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/internal/redisserver"
	"github.com/fencekit/fence/internal/testmain"
	"github.com/redis/go-redis/v9"
)

// addr is the primary the benchmarks use; it has one replica in sync, for
// fence's replica sync, at replicaAddr.
var addr, replicaAddr string

func TestMain(m *testing.M) {
	testmain.Run(m, func() (func(), error) {
		primary, replicas, err := redisserver.StartReplicated(1)
		if err != nil {
			return nil, err
		}
		addr, replicaAddr = primary.Addr, replicas[0].Addr
		return func() { replicas[0].Close(); primary.Close() }, nil
	})
}

// BenchmarkUncontended is the uncontended workload of make bench (one
// goroutine, one key, acquire then release, each library called exactly as
// there), as a Go benchmark, for CPU and allocation profiles:
//
//	go test -run '^$' -bench 'Uncontended/fence_(sync_off)' -benchmem \
//	    -cpuprofile cpu.out -memprofile mem.out -memprofilerate 1
//	go tool pprof -sample_index alloc_objects -top bench.test mem.out
func BenchmarkUncontended(b *testing.B) { benchUncontended(b, context.Background()) }

// BenchmarkUncontendedDeadline is BenchmarkUncontended with a caller's
// context that has a deadline (an hour away), as a request's context has:
// fence then bounds every call by it in a goroutine of its own.
func BenchmarkUncontendedDeadline(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	benchUncontended(b, ctx)
}

func benchUncontended(b *testing.B, ctx context.Context) {
	ls, err := libs(addr)
	if err != nil {
		b.Fatal(err)
	}
	ls = append(ls, limit(addr))
	defer func() {
		for _, l := range ls {
			l.close()
		}
	}()
	for _, l := range ls {
		b.Run(l.name, func(b *testing.B) {
			key := "bench:profile:" + l.name
			for b.Loop() {
				release, err := l.acquire(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				release()
			}
		})
	}
}

// BenchmarkCPU is the uncontended workload again, reporting the CPU time
// that one acquire+release costs the server and its replica (INFO cpu, their
// user and system time) and this process (getrusage), per pair: where
// latency goes on a machine where client and servers share the CPUs.
func BenchmarkCPU(b *testing.B) { benchCPU(b, context.Background()) }

// BenchmarkCPUDeadline is BenchmarkCPU with a caller's context that has a
// deadline, as BenchmarkUncontendedDeadline.
func BenchmarkCPUDeadline(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	benchCPU(b, ctx)
}

func benchCPU(b *testing.B, ctx context.Context) {
	ls, err := libs(addr)
	if err != nil {
		b.Fatal(err)
	}
	ls = append(ls, limit(addr))
	defer func() {
		for _, l := range ls {
			l.close()
		}
	}()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	replica := redis.NewClient(&redis.Options{Addr: replicaAddr})
	defer replica.Close()
	scripts, closeScripts := newScriptClock(addr)
	defer closeScripts()
	cpuOf := func(admin *redis.Client) time.Duration {
		info, err := admin.Info(ctx, "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		var total float64
		for _, line := range strings.Split(info, "\r\n") {
			k, v, _ := strings.Cut(line, ":")
			if k == "used_cpu_sys" || k == "used_cpu_user" {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				total += f
			}
		}
		return time.Duration(total * float64(time.Second))
	}
	serverCPU := func() time.Duration { return cpuOf(admin) }
	replicaCPU := func() time.Duration { return cpuOf(replica) }
	clientCPU := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for _, l := range ls {
		b.Run(l.name, func(b *testing.B) {
			key := "bench:cpu:" + l.name
			scripts0, err := scripts()
			if err != nil {
				b.Fatal(err)
			}
			s0, r0, c0 := serverCPU(), replicaCPU(), clientCPU()
			for b.Loop() {
				release, err := l.acquire(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				release()
			}
			s1, r1, c1 := serverCPU(), replicaCPU(), clientCPU()
			scripts1, err := scripts()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64((s1-s0).Nanoseconds())/1000/float64(b.N), "server-µs/op")
			b.ReportMetric(float64((r1-r0).Nanoseconds())/1000/float64(b.N), "replica-µs/op")
			b.ReportMetric(float64((c1-c0).Nanoseconds())/1000/float64(b.N), "client-µs/op")
			b.ReportMetric((scripts1-scripts0)/float64(b.N), "script-µs/op")
		})
	}
}

// BenchmarkRedlock is the uncontended workload on fence's redlock and on
// redsync, over 3 independent redis-servers started for it.
func BenchmarkRedlock(b *testing.B) {
	var addrs []string
	for range 3 {
		s, err := redisserver.Start(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(s.Close)
		addrs = append(addrs, s.Addr)
	}
	ls, err := redlockLibs(addrs)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, l := range ls {
			l.close()
		}
	}()
	ctx := context.Background()
	for _, l := range ls {
		b.Run(l.name, func(b *testing.B) {
			key := "bench:profile:" + l.name
			for b.Loop() {
				release, err := l.acquire(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				release()
			}
		})
	}
}

// BenchmarkP50 is make bench's uncontended latency figure for the rows that
// issue 18 compares, and for their floors: -benchtime Nx runs N rounds of
// 2000 pairs, interleaved in batches as make bench times them, and logs
// (-v) each row's p50 in every round and the median round. The floors are
// go-redis sending the least each mode needs: two EVALSHAs, and for replica
// sync the first pipelined with WAIT 1 on the same connection; and two
// EVALSHAs whose first also issues a counter token, the least a fenced lock
// writes.
//
//	go test -run '^$' -bench P50 -benchtime 5x -v
func BenchmarkP50(b *testing.B) {
	all, err := libs(addr)
	if err != nil {
		b.Fatal(err)
	}
	all = append(all, limit(addr), limitSynced(addr), limitToken(addr))
	var ls []*lib
	for _, l := range all {
		defer l.close()
		switch l.name {
		case "fence (sync off)", "fence (sync on, 1 replica)", "bsm/redislock", limitRow, limitSyncedRow, limitTokenRow:
			ls = append(ls, l)
		}
	}
	p50s := make([][]time.Duration, len(ls))
	round := 0
	for b.Loop() {
		lat, err := uncontended(ls, 2000, round, nil)
		if err != nil {
			b.Fatal(err)
		}
		for i := range ls {
			p50s[i] = append(p50s[i], lat[i].p50)
		}
		round++
	}
	for i, l := range ls {
		rounds := slices.Clone(p50s[i])
		slices.Sort(p50s[i])
		b.Logf("%-45s p50 median %6.1f µs, rounds %v", l.name, float64(p50s[i][len(p50s[i])/2].Nanoseconds())/1000, rounds)
	}
}
