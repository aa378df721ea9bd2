package cli

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
)

// marker starts every password the URL fuzz targets hide: no error may
// contain it.
const marker = "Zq9"

// urlKinds are the three ways fence reads a Redis URL.
var urlKinds = []func(string) *redisFlags{
	func(u string) *redisFlags { return &redisFlags{url: u} },
	func(u string) *redisFlags { return &redisFlags{sentinelURL: u} },
	func(u string) *redisFlags { return &redisFlags{clusterURL: u} },
}

// checkURL parses raw as the kind'th URL kind: no panic; the client is
// closed again; no error contains the marker.
func checkURL(t *testing.T, kind int, raw string, hidden bool) {
	c, err := urlKinds[kind%len(urlKinds)](raw).client(nil)
	if err != nil {
		if hidden && strings.Contains(err.Error(), marker) {
			t.Fatalf("the error for %q shows the password: %v", raw, err)
		}
		return
	}
	_ = c.Close()
}

// FuzzRedisURL: URLs with a password in the user info, free text around
// it, as a standalone, Sentinel or Cluster URL. No panic, and no error shows
// the password (raw or percent-decoded).
func FuzzRedisURL(f *testing.F) {
	for _, s := range [][3]string{
		{"redis", "secret", "host:6379/0"},
		{"rediss", "p%40ss", "host:notaport"},
		{"redis", "a/b", "host?db=x"},
		{"unix", "pw", "/tmp/redis.sock?db=1"},
		{"redis", "pw", "s1:26379?master_name=m&addr=s2:26379"},
		{"redis", "x", "n1:1?addr=u:pw@n2:::"},
		{"http", "%zz", "h\x7f"},
		{"redis", "pw", "h?dial_timeout=-1&pool_size=99999999999999999999"},
		{"redis", "pw", "h?pool_size=2147483648"},
		{"redis", "pw", "h?min_idle_conns=99999999&max_active_conns=-1"},
	} {
		f.Add(uint8(0), s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, kind uint8, scheme, pass, rest string) {
		if strings.Contains(strings.ToLower(scheme+rest), strings.ToLower(marker)) {
			t.Skip()
		}
		checkURL(t, int(kind), scheme+"://user:"+marker+pass+"@"+rest, true)
		checkURL(t, int(kind), scheme+"://:"+marker+pass+"@"+rest, true)
		// A password in the query, which Sentinel URLs read.
		checkURL(t, int(kind), scheme+"://"+rest+"?master_name=m&password="+marker+pass, true)
		// Without "//": an opaque URL to url.Parse.
		checkURL(t, int(kind), scheme+":user:"+marker+pass+"@"+rest, true)
		// Free text: only no panic.
		checkURL(t, int(kind), scheme+pass+rest, false)
	})
}

// FuzzDurations: --wait, --ttl, --grace and --watchdog-ttl as typed. What
// the flags accept is exactly what time.ParseDuration reads (no coercion),
// and what validation accepts is non-negative and a lease time the library
// takes; the rest is refused with an error naming the flag.
func FuzzDurations(f *testing.F) {
	for _, s := range [][4]string{
		{"0", "1ms", "10s", "30s"},
		{"-1s", "0s", "-1ns", "0"},
		{"9223372036854775807ns", "2562047h", "1e9h", "99999999999h"},
		{"1.5s", "1µs", "1us", ".5ms"},
		{"", "abc", "1", "+5s"},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, wait, ttl, grace, watchdog string) {
		cmd := execCmd()
		err := cmd.Flags().Parse([]string{"--wait=" + wait, "--ttl=" + ttl, "--grace=" + grace, "--watchdog-ttl=" + watchdog})
		for _, in := range []string{wait, ttl, grace, watchdog} {
			if _, perr := time.ParseDuration(in); perr != nil && err == nil {
				t.Fatalf("flags accepted %q, which time.ParseDuration refuses", in)
			}
		}
		if err != nil {
			return
		}
		get := func(name string) time.Duration {
			d, err := cmd.Flags().GetDuration(name)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		w, l, g, wd := get("wait"), get("ttl"), get("grace"), get("watchdog-ttl")
		if want, _ := time.ParseDuration(ttl); l != want {
			t.Fatalf("--ttl %q read as %v, want %v", ttl, l, want)
		}
		err = validateDurations(w, l, true, g, wd)
		if err == nil {
			if w < 0 || g < 0 || fence.ValidateTTL(l) != nil || fence.ValidateTTL(wd) != nil {
				t.Fatalf("accepted wait %v ttl %v grace %v watchdog %v", w, l, g, wd)
			}
			return
		}
		if !strings.HasPrefix(err.Error(), "--") {
			t.Fatalf("error does not name the flag: %v", err)
		}
		if (l < 0 || wd < 0) && w >= 0 && g >= 0 && !errors.Is(err, fence.ErrInvalidOption) {
			t.Fatalf("a bad lease time is not ErrInvalidOption: %v", err)
		}
	})
}

// FuzzAcks: --acks and --replicas. Accepted values map to a positive number
// or AcksMajority/AcksAll, never more acks than the replicas given; the rest
// is refused with an error naming the flag.
func FuzzAcks(f *testing.F) {
	for _, s := range []string{"1", "majority", "all", "ALL", "0", "-1", "-2", "x", "", " 1", "99999999999999999999", "+3", "0x10", "1_000"} {
		f.Add(s, 0)
		f.Add(s, 2)
	}
	f.Fuzz(func(t *testing.T, acks string, replicas int) {
		rf := &redisFlags{acks: acks, replicas: replicas}
		rs, err := rf.replicaSync(func(string) bool { return true })
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--") {
				t.Fatalf("error does not name the flag: %v", err)
			}
			return
		}
		switch lower := strings.ToLower(acks); {
		case lower == "majority" || lower == "all":
		default:
			n, perr := strconv.Atoi(acks)
			if perr != nil || n != rs.Acks || n < 1 {
				t.Fatalf("--acks %q accepted as %d", acks, rs.Acks)
			}
			if replicas > 0 && n > replicas {
				t.Fatalf("--acks %d accepted with --replicas %d", n, replicas)
			}
		}
		if rs.Replicas != replicas || replicas < 0 || rs.Disabled {
			t.Fatalf("--replicas %d accepted as %+v", replicas, rs)
		}
	})
}
