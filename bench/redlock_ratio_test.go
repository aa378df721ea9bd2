package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/fencekit/fence/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

// BenchmarkRedlockRatio measures only the Redlock rows of make bench: the
// uncontended p50 of fence's redlock and redsync's on 3 and on 5
// independent redis-servers (the median of 3 rounds in rotating order, as
// make bench), the allocations per pair, and the commands each sends per
// pair (through a counting proxy per node) with the servers' CPU time per
// pair (INFO cpu; the proxies' own work is the client's). It runs its workload once,
// whatever b.N:
//
//	go test -run '^$' -bench RedlockRatio -benchtime 1x
func BenchmarkRedlockRatio(b *testing.B) {
	const n = 3000
	var addrs []string
	for range 5 {
		s, err := redisserver.Start(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(s.Close)
		addrs = append(addrs, s.Addr)
	}
	var ls []*lib
	defer func() {
		for _, l := range ls {
			l.close()
		}
	}()
	for _, k := range []int{3, 5} {
		more, err := redlockLibs(addrs[:k])
		if err != nil {
			b.Fatal(err)
		}
		ls = append(ls, more...)
	}
	rows, err := rotate(ls, n, nil, func(l *lib, r *row) error {
		var err error
		r.allocs, err = allocs(l, n)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < len(rows); i += 2 {
		f, r := rows[i], rows[i+1]
		b.Logf("%-28s p50 %sµs p99 %sµs allocs %5.1f", f.name, us(f.p50), us(f.p99), f.allocs)
		b.Logf("%-28s p50 %sµs p99 %sµs allocs %5.1f", r.name, us(r.p50), us(r.p99), r.allocs)
		b.Logf("%-28s p50 ratio %.3f×", "", float64(f.p50)/float64(r.p50))
	}

	// Commands per pair, through a counting proxy in front of each node.
	var proxies []*countingProxy
	var paddrs []string
	for _, a := range addrs {
		p, err := newCountingProxy(a)
		if err != nil {
			b.Fatal(err)
		}
		defer p.close()
		proxies = append(proxies, p)
		paddrs = append(paddrs, p.addr())
	}
	sum := func() (t int64) {
		for _, p := range proxies {
			t += p.commands.Load()
		}
		return t
	}
	var admins []*redis.Client
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		defer c.Close()
		admins = append(admins, c)
	}
	for _, k := range []int{3, 5} {
		cls, err := redlockLibs(paddrs[:k])
		if err != nil {
			b.Fatal(err)
		}
		for _, l := range cls {
			if _, err := allocs(l, 100); err != nil { // warm: connections, scripts
				b.Fatal(err)
			}
			const m = 2000
			var cpu0 float64
			for _, a := range admins[:k] {
				cpu0 += serverCPU(b, a)
			}
			before := sum()
			for range m {
				release, err := l.acquire(b.Context(), "bench:count:"+l.name)
				if err != nil {
					b.Fatal(err)
				}
				release()
			}
			cmds := sum() - before
			usec := -cpu0
			for _, a := range admins[:k] {
				usec += serverCPU(b, a)
			}
			b.Logf("%-28s %.2f commands per pair (%.2f per node), %.1f µs of server CPU per pair (%.1f per node)",
				l.name, float64(cmds)/m, float64(cmds)/m/float64(k), usec/m, usec/m/float64(k))
			l.close()
		}
	}
}

// serverCPU is the server's CPU time so far (INFO cpu, user and system), in
// µs: what the pairs cost the servers, network I/O and scripts included.
func serverCPU(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(b.Context(), "cpu").Result()
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
			total += f * 1e6
		}
	}
	return total
}
