package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/fencekit/fence/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

// scriptParts measures what each part of redislock's scripts costs the
// server on their common paths (a free lock, nobody queued, not revoked;
// a release nobody waits for): each variant is the script with one part
// removed or replaced (not behaviour-preserving: for measuring only), run
// by EVALSHA on many locks that hold a token record, as the uncontended
// workload's do. Variants alternate within each round, in rotating order,
// so that a burst of load falls on all of them; the figures are medians
// of the rounds (see bench/scripttime.md). It reads the scripts from
// ../redislock, so it runs from bench/.
func scriptParts(rounds, locks int) error {
	acq, rel, err := readScripts("../redislock")
	if err != nil {
		return err
	}
	vs, err := partVariants(acq, rel)
	if err != nil {
		return err
	}
	for _, replicated := range []bool{false, true} {
		var addr string
		if replicated {
			primary, replicas, err := redisserver.StartReplicated(1)
			if err != nil {
				return err
			}
			defer primary.Close()
			defer replicas[0].Close()
			addr = primary.Addr
		} else {
			s, err := redisserver.Start("")
			if err != nil {
				return err
			}
			defer s.Close()
			addr = s.Addr
		}
		res, err := measureParts(addr, vs, rounds, locks)
		if err != nil {
			return err
		}
		printParts(replicated, vs, res)
		if !replicated {
			if err := loopParts(addr, rounds); err != nil {
				return err
			}
		}
	}
	return nil
}

// readScripts returns acquire.lua and release.lua as redislock runs them:
// token.lua and grant.lua in place of their marker line (see scripts.go).
func readScripts(dir string) (acquire, release string, err error) {
	read := func(f string) string {
		b, e := os.ReadFile(filepath.Join(dir, f))
		if e != nil && err == nil {
			err = e
		}
		return string(b)
	}
	shared := read("token.lua") + read("grant.lua")
	acquire = strings.Replace(read("acquire.lua"), "-- grant.lua --\n", shared, 1)
	release = strings.Replace(read("release.lua"), "-- grant.lua --\n", shared, 1)
	return acquire, release, err
}

// partVariant is one script run in the acquire or the release phase, with
// the keys and arguments it is called with (how many: the names and
// values are the lock's, as redislock sends them).
type partVariant struct {
	name    string
	release bool // runs in the release phase (the acquire phase runs fence's acquire)
	src     string
	keys    int
	args    int
}

// partVariants are fence's scripts and their cut-down variants, with the
// floors and bare invocations to compare them with. A replacement that no
// longer matches the script is an error, so that the table never reports a
// variant that is the full script under another name.
func partVariants(acq, rel string) ([]partVariant, error) {
	var err error
	cut := func(src string, pairs ...string) string {
		for i := 0; i < len(pairs); i += 2 {
			if strings.Count(src, pairs[i]) != 1 && err == nil {
				err = fmt.Errorf("scriptparts: %q is not once in the script", pairs[i])
			}
			src = strings.Replace(src, pairs[i], pairs[i+1], 1)
		}
		return src
	}
	vs := []partVariant{
		{name: "acquire: fence", src: acq, keys: 5, args: 5},
		{name: "acquire: no EXISTS queue+revoked", src: cut(acq, "marks = redis.call('EXISTS', queue, revoked)", "marks = 0"), keys: 5, args: 5},
		{name: "acquire: no GET record", src: cut(acq, "local rec = redis.call('GET', record)\n  if not rec or", "local rec = false\n  if not rec or"), keys: 5, args: 5},
		{name: "acquire: no string.match/#rec check", src: cut(acq, "if not rec or (rec == '0' or string.match(rec, '^[1-9]%d*$'))\n    and (#rec < 16 or #rec == 16 and rec <= '9007199254740990') then", "if true then"), keys: 5, args: 5},
		{name: "acquire: TIME as a constant", src: cut(acq, "    now = redis.call('TIME')\n    local s", "    now = {'1800000000', '123456'}\n    local s"), keys: 5, args: 5},
		{name: "acquire: no string.format", src: cut(acq, "redis.call('SET', record, string.format('%d', token), 'PX', ARGV[3])\n      return {1", "redis.call('SET', record, '1', 'PX', ARGV[3])\n      return {1"), keys: 5, args: 5},
		{name: "acquire: record a 16-digit constant, no string.format", src: cut(acq, "redis.call('SET', record, string.format('%d', token), 'PX', ARGV[3])\n      return {1", "redis.call('SET', record, '1765000000000000', 'PX', ARGV[3])\n      return {1"), keys: 5, args: 5},
		{name: "acquire: record by concatenation of TIME's strings", src: cut(acq, "redis.call('SET', record, string.format('%d', token), 'PX', ARGV[3])\n      return {1", "redis.call('SET', record, now[1] .. string.sub(us + 1000000, 2), 'PX', ARGV[3])\n      return {1"), keys: 5, args: 5},
		{name: "acquire: server ms by arithmetic, no math.floor", src: cut(acq, "return {1, token, s * 1000 + math.floor(us / 1000)}", "return {1, token, (s * 1000000 + us - us % 1000) / 1000}"), keys: 5, args: 5},
		{name: "acquire: reply {token, ms}", src: cut(acq, "return {1, token, s * 1000 + math.floor(us / 1000)}", "return {token, s * 1000 + math.floor(us / 1000)}"), keys: 5, args: 5},
		{name: "acquire: reply a string 'token ms'", src: cut(acq, "redis.call('SET', record, string.format('%d', token), 'PX', ARGV[3])\n      return {1, token, s * 1000 + math.floor(us / 1000)}", "local str = string.format('%d', token)\n      redis.call('SET', record, str, 'PX', ARGV[3])\n      return str .. ' ' .. (s * 1000 + math.floor(us / 1000))"), keys: 5, args: 5},
		{name: "acquire: no SET record", src: cut(acq, "redis.call('SET', record, string.format('%d', token), 'PX', ARGV[3])\n      return {1", "return {1"), keys: 5, args: 5},
		{name: "acquire: reply 1, not a table", src: cut(acq, "return {1, token, s * 1000 + math.floor(us / 1000)}", "return 1"), keys: 5, args: 5},
		{name: "acquire: no string.sub of owner", src: cut(acq, "local owner = string.sub(ARGV[1], 1, 32)", "local owner = ARGV[1]"), keys: 5, args: 5},
		{name: "acquire: ARGV[1] owner only (32 bytes)", src: acq, keys: 5, args: 5},
		{name: "acquire: 3 arguments (no wait, no try)", src: acq, keys: 5, args: 3},
		{name: "acquire: floor, SET NX PX + INCR", src: "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return redis.call('INCR', KEYS[2]) end return 0", keys: 2, args: 2},
		{name: "release: fence", release: true, src: rel, keys: 7, args: 4},
		{name: "release: EXISTS queue only", release: true, src: cut(rel, "redis.call('EXISTS', queue, KEYS[5])", "redis.call('EXISTS', queue)"), keys: 7, args: 4},
		{name: "release: no released-by record (a give-back's)", release: true, src: rel, keys: 7, args: 2},
		{name: "release: RENAME by redis.call, no DEL after a refusal", release: true, src: cut(rel, "if not ARGV[4] or redis.pcall('RENAME', lock, KEYS[7]).err then\n  redis.call('DEL', lock)\nend", "if ARGV[4] then\n  redis.call('RENAME', lock, KEYS[7])\nelse\n  redis.call('DEL', lock)\nend"), keys: 7, args: 4},
		{name: "release: no EXISTS", release: true, src: cut(rel, "if redis.call('EXISTS', queue, KEYS[5]) == 0 then", "if true then"), keys: 7, args: 4},
		{name: "release: floor, GET + DEL", release: true, src: "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0", keys: 1, args: 1},
		{name: "bare: return 1, 1 key 1 arg", src: "return 1", keys: 1, args: 1},
		{name: "bare: return 1, 2 keys 2 args", src: "return 1", keys: 2, args: 2},
		{name: "bare: return 1, 5 keys 5 args", src: "return 1", keys: 5, args: 5},
		{name: "bare: return 1, 7 keys 4 args", src: "return 1", keys: 7, args: 4},
	}
	return vs, err
}

// partResult is a variant's figures per round: µs per call inside the
// command (INFO commandstats) and the server's CPU µs per call (INFO cpu,
// user+sys: parsing, replies and propagation to replicas included).
type partResult struct{ cmd, cpu []float64 }

func measureParts(addr string, vs []partVariant, rounds, locks int) ([]partResult, error) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	shas := make([]string, len(vs))
	for i, v := range vs {
		shas[i] = redis.NewScript(v.src).Hash()
	}
	acqSHA, relSHA := shas[0], shas[indexOf(vs, "release: fence")]
	// load empties the script cache (SCRIPT FLUSH makes a new Lua
	// interpreter) and loads fence's acquire and release scripts and the
	// variant: each variant runs in a heap that holds what a server running
	// fence holds, not every variant's compiled code, which Lua's garbage
	// collector would walk on every cycle.
	load := func(v partVariant) error {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			return err
		}
		for _, src := range []string{vs[0].src, vs[indexOf(vs, "release: fence")].src, v.src} {
			if err := c.ScriptLoad(ctx, src).Err(); err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
		}
		return nil
	}
	keys := make([][]string, locks)
	for i := range keys {
		base := fmt.Sprintf("fence:{part%d}", i)
		keys[i] = []string{base, base + ":token", base + ":revoked:" + strings.Repeat("0", 32), base + ":queue", base + ":waiters", base + ":waiting", base + ":released-by"}
	}
	// release.lua's keys: lock, token, queue, waiters, waiting, revoked,
	// released-by.
	relKeys := func(k []string, n int) []string {
		return []string{k[0], k[1], k[3], k[4], k[5], k[2], k[6]}[:n]
	}
	res := make([]partResult, len(vs))
	for r := 0; r < rounds; r++ {
		for j := range vs {
			i := (j + r) % len(vs)
			v := vs[i]
			owner := newOwner()
			ownerArg := owner
			if !strings.Contains(v.name, "owner only") {
				ownerArg += newOwner()[:16]
			}
			// An acquire variant is called with its own arguments, a
			// release variant after fence's acquire with fence's.
			acqArgs := []any{ownerArg, "10000", "86400000", "0", "0"}
			if !v.release && !strings.HasPrefix(v.name, "bare") {
				acqArgs = acqArgs[:v.args]
			}
			relArgs := []any{ownerArg, "86400000", "-1", "1"}[:min(v.args, 4)]
			acquire := func(sha string, n int, args []any) error {
				return pipelined(ctx, c, locks, func(p redis.Pipeliner, k int) {
					p.EvalSha(ctx, sha, keys[k][:n], args...)
				})
			}
			release := func(sha string, n int, args []any) error {
				return pipelined(ctx, c, locks, func(p redis.Pipeliner, k int) {
					p.EvalSha(ctx, sha, relKeys(keys[k], n), args...)
				})
			}
			measure := func(f func() error) (cmd, cpu float64, err error) {
				if err := c.ConfigResetStat(ctx).Err(); err != nil {
					return 0, 0, err
				}
				cpu0, err := usedCPU(ctx, c)
				if err != nil {
					return 0, 0, err
				}
				if err := f(); err != nil {
					return 0, 0, fmt.Errorf("%s: %w", v.name, err)
				}
				cpu1, err := usedCPU(ctx, c)
				if err != nil {
					return 0, 0, err
				}
				us, err := evalshaUsec(ctx, c)
				return us / float64(locks), (cpu1 - cpu0) / float64(locks), err
			}
			if err := load(v); err != nil {
				return nil, err
			}
			// Each variant runs twice: first to warm the server up (its
			// allocator, the keys' encodings), then measured.
			var cmd, cpu float64
			for pass := 0; pass < 2; pass++ {
				m := measure
				if pass == 0 {
					m = func(f func() error) (float64, float64, error) { return 0, 0, f() }
				}
				var err error
				switch {
				case strings.HasPrefix(v.name, "bare"):
					cmd, cpu, err = m(func() error { return acquire(shas[i], v.keys, acqArgs[:v.args]) })
				case v.release:
					if err = acquire(acqSHA, 5, acqArgs); err == nil {
						cmd, cpu, err = m(func() error { return release(shas[i], v.keys, relArgs) })
					}
				default:
					if cmd, cpu, err = m(func() error { return acquire(shas[i], v.keys, acqArgs) }); err == nil {
						err = release(relSHA, 7, []any{ownerArg, "86400000"})
					}
				}
				if err != nil {
					return nil, err
				}
				// Whatever a variant left (a lock its release did not
				// recognise), the next pass finds every lock free.
				if err := pipelined(ctx, c, locks, func(p redis.Pipeliner, k int) { p.Del(ctx, keys[k][0]) }); err != nil {
					return nil, err
				}
			}
			res[i].cmd = append(res[i].cmd, cmd)
			res[i].cpu = append(res[i].cpu, cpu)
		}
		log.Printf("scriptparts: round %d of %d", r+1, rounds)
	}
	return res, nil
}

func indexOf(vs []partVariant, name string) int {
	for i, v := range vs {
		if v.name == name {
			return i
		}
	}
	panic("scriptparts: no variant " + name)
}

func newOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// pipelined sends n commands made by add in pipelines of 50, and fails on
// the first error reply (a script error, NOSCRIPT).
func pipelined(ctx context.Context, c *redis.Client, n int, add func(redis.Pipeliner, int)) error {
	for i := 0; i < n; i += 50 {
		p := c.Pipeline()
		for k := i; k < min(i+50, n); k++ {
			add(p, k)
		}
		cmds, err := p.Exec(ctx)
		if err != nil && err != redis.Nil {
			return err
		}
		for _, cmd := range cmds {
			if err := cmd.Err(); err != nil && err != redis.Nil {
				return err
			}
		}
	}
	return nil
}

func usedCPU(ctx context.Context, c *redis.Client) (float64, error) {
	s, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var us float64
	for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
		_, v, ok := strings.Cut(s, "\r\n"+f)
		if !ok {
			return 0, fmt.Errorf("INFO cpu without %s", f)
		}
		v, _, _ = strings.Cut(v, "\r\n")
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, err
		}
		us += x * 1e6
	}
	return us, nil
}

// evalshaUsec is EVALSHA's usec in INFO commandstats.
func evalshaUsec(ctx context.Context, c *redis.Client) (float64, error) {
	s, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	_, v, ok := strings.Cut(s, "cmdstat_evalsha:")
	if !ok {
		return 0, fmt.Errorf("no EVALSHA in commandstats")
	}
	_, v, _ = strings.Cut(v, "usec=")
	v, _, _ = strings.Cut(v, ",")
	return strconv.ParseFloat(v, 64)
}

func medianOf(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// printParts prints a markdown table: each variant's µs per call (the
// median round, and the least: a loaded machine only adds time), and
// against the full script of its phase (fence's acquire or release; the
// bare invocations against the one with fence's 5 keys and 5 arguments)
// the median of the per-round ratios and of the per-round differences,
// in commandstats time and in the server's CPU time.
func printParts(replicated bool, vs []partVariant, res []partResult) {
	if replicated {
		fmt.Println("\nWith one replica attached:")
	} else {
		fmt.Println("\nNo replica:")
	}
	fmt.Println("\n| variant | keys, args | cmd µs/call (least) | ÷ full | − full, µs | CPU µs/call | − full, CPU µs |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
	for i, v := range vs {
		full := 0
		if v.release {
			full = indexOf(vs, "release: fence")
		} else if strings.HasPrefix(v.name, "bare") {
			full = indexOf(vs, "bare: return 1, 5 keys 5 args")
		}
		per := func(a, b []float64, f func(x, y float64) float64) float64 {
			d := make([]float64, len(a))
			for r := range a {
				d[r] = f(a[r], b[r])
			}
			return medianOf(d)
		}
		sub := func(x, y float64) float64 { return x - y }
		div := func(x, y float64) float64 { return x / y }
		r, f := res[i], res[full]
		fmt.Printf("| %s | %d, %d | %.2f (%.2f) | %.3f | %+.2f | %.2f | %+.2f |\n", v.name, v.keys, v.args,
			medianOf(r.cmd), minOf(r.cmd), per(r.cmd, f.cmd, div), per(r.cmd, f.cmd, sub), medianOf(r.cpu), per(r.cpu, f.cpu, sub))
	}
}

func minOf(xs []float64) float64 {
	m := xs[0]
	for _, x := range xs {
		m = min(m, x)
	}
	return m
}

// loopParts times each call of the common paths inside one script run in
// a loop (no per-EVALSHA cost, the script's own garbage collected as it
// goes), less the loop's own cost, in rounds.
// Writes go to fresh keys where the scripts' do (the lock), to one key
// that exists where theirs do (the token record).
func loopParts(addr string, rounds int) error {
	const n = 20000
	parts := []struct{ name, body string }{
		{"loop alone (subtracted)", "x = p .. i"},
		{"SET lock NX GET PX (free)", "x = redis.call('SET', p .. i, owner, 'NX', 'GET', 'PX', '10000')"},
		{"EXISTS of 2 absent keys", "x = p .. i x = redis.call('EXISTS', 'nq', 'nr')"},
		{"GET record (16 digits)", "x = p .. i x = redis.call('GET', 'rec')"},
		{"string.match and #rec checks", "x = p .. i x = (rec == '0' or string.match(rec, '^[1-9]%d*$')) and (#rec < 16 or #rec == 16 and rec <= '9007199254740990')"},
		{"TIME", "x = p .. i x = redis.call('TIME')"},
		{"tonumber ×2, arithmetic", "x = p .. i x = tonumber(now[1]) * 1000000 + tonumber(now[2])"},
		{"string.format('%d', token)", "x = p .. i x = string.format('%d', token + i)"},
		{"SET record PX (exists)", "x = p .. i x = redis.call('SET', 'rec', '1765000000123456', 'PX', '86400000')"},
		{"reply table {1, token, ms} made", "x = p .. i x = {1, token, s * 1000 + math.floor(us / 1000)}"},
		{"string.sub of owner", "x = p .. i x = string.sub(arg1, 1, 32 + i % 2)"},
		{"GET lock (release)", "x = p .. i x = redis.call('GET', 'lk')"},
		{"DEL lock (release; the SET's keys)", "x = redis.call('DEL', p .. i)"},
	}
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	pre := "local owner = '" + strings.Repeat("a", 32) + "' local arg1 = owner .. '" + strings.Repeat("b", 16) + "' " +
		"redis.call('SET', 'rec', '1765000000123456') redis.call('SET', 'lk', owner) local rec = redis.call('GET', 'rec') " +
		"local now = redis.call('TIME') local s, us = tonumber(now[1]), tonumber(now[2]) local token = s * 1000000 + us " +
		"local p = 'fence:{loop' .. ARGV[1] .. '}' local x "
	got := make([][]float64, len(parts))
	for r := 0; r < rounds; r++ {
		// In order, not rotated: DEL deletes the keys that the SET of
		// the same round made.
		for i := range parts {
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				return err
			}
			src := pre + fmt.Sprintf("for i = 1, %d do %s end return 1", n, parts[i].body)
			if err := c.Eval(ctx, src, nil, r).Err(); err != nil {
				return fmt.Errorf("%s: %w", parts[i].name, err)
			}
			s, err := c.Info(ctx, "commandstats").Result()
			if err != nil {
				return err
			}
			_, v, _ := strings.Cut(s, "cmdstat_eval:")
			_, v, _ = strings.Cut(v, "usec=")
			v, _, _ = strings.Cut(v, ",")
			us, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return err
			}
			got[i] = append(got[i], us/n)
		}
	}
	fmt.Println("\nInside one script, in a loop of", n, "(no replica):")
	// A loaded machine only adds time (the server loses its CPU in the
	// middle of a loop), so the least of the rounds is the best estimate
	// of a call's own cost; the median is given beside it.
	fmt.Println("\n| call | µs each, least of the rounds, less the loop's | median less the loop's median |")
	fmt.Println("|---|---:|---:|")
	for i, pt := range parts {
		least, med := minOf(got[i]), medianOf(got[i])
		if i > 0 {
			least, med = least-minOf(got[0]), med-medianOf(got[0])
		}
		fmt.Printf("| %s | %.2f | %.2f |\n", pt.name, least, med)
	}
	return nil
}
