package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkDistinctCPU is the distinct-keys workload (64 goroutines on 2
// CPUs, each on its own key) as a Go benchmark, made for the batching
// experiment of issue 18 (redislock/batch.go, bench/batching.md): besides
// pairs/s, it reports the redis-server's CPU time per acquire+release pair
// (from /proc), which the other helpers' load on the machine disturbs far
// less than throughput, and this process's:
//
//	go test -run '^$' -bench DistinctCPU -benchtime 3s -count 3
func BenchmarkDistinctCPU(b *testing.B) {
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
	defer func() { _ = admin.Close() }()
	pid, err := serverPID(admin)
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range ls {
		switch l.name {
		case "fence (sync off)", "bsm/redislock", "limit: 2 × EVALSHA (go-redis)", "fence (sync on, 1 replica)":
		default:
			continue
		}
		b.Run(strings.ReplaceAll(l.name, " ", "_"), func(b *testing.B) {
			ctx := context.Background()
			var next atomic.Int64
			var failed atomic.Value
			if err := admin.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			srvBefore, err := procCPU(pid)
			if err != nil {
				b.Fatal(err)
			}
			selfBefore := selfCPU()
			start := time.Now()
			b.SetParallelism(32) // 64 goroutines on 2 CPUs
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				key := fmt.Sprintf("bench:distinctcpu:%s:%d", l.name, next.Add(1))
				for pb.Next() {
					release, err := l.acquire(ctx, key)
					if err != nil {
						failed.CompareAndSwap(nil, err)
						return
					}
					release()
				}
			})
			b.StopTimer()
			elapsed := time.Since(start)
			if err, _ := failed.Load().(error); err != nil {
				b.Fatal(err)
			}
			srvAfter, err := procCPU(pid)
			if err != nil {
				b.Fatal(err)
			}
			n := float64(b.N)
			usec, err := commandsUsec(admin)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(usec)/n, "cmd-µs/pair")
			b.ReportMetric(n/elapsed.Seconds(), "pairs/s")
			b.ReportMetric(float64((srvAfter-srvBefore).Microseconds())/n, "server-µs/pair")
			b.ReportMetric(float64((selfCPU()-selfBefore).Microseconds())/n, "client-µs/pair")
		})
	}
}

// commandsUsec is the time the server spent running commands (their
// usec in INFO commandstats, summed) since the last CONFIG RESETSTAT.
func commandsUsec(c *redis.Client) (int64, error) {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, line := range strings.Split(info, "\r\n") {
		_, rest, ok := strings.Cut(line, ":calls=")
		if !ok || strings.HasPrefix(line, "cmdstat_info:") || strings.HasPrefix(line, "cmdstat_config") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "usec="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, err
				}
				sum += n
			}
		}
	}
	return sum, nil
}

// serverPID is the redis-server's process id, from INFO.
func serverPID(c *redis.Client) (int, error) {
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("no process_id in INFO")
}

// procCPU is pid's user+system CPU time, from /proc/pid/stat.
func procCPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from 3 on
	ut, err1 := strconv.ParseInt(f[11], 10, 64)              // field 14
	st, err2 := strconv.ParseInt(f[12], 10, 64)              // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	const tick = 10 * time.Millisecond // USER_HZ 100
	return time.Duration(ut+st) * tick, nil
}

// selfCPU is this process's user+system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
