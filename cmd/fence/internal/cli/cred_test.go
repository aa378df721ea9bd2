package cli_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
)

// secret is the password the credential tests hide; each URL below carries
// it somewhere fence might echo.
const secret = "hunter2-s3cret"

// TestHelpMasksPasswords: the flag defaults taken from the environment are
// shown with the password masked.
func TestHelpMasksPasswords(t *testing.T) {
	t.Parallel()
	env := []string{
		"FENCE_REDIS_URL=redis://alice:" + secret + "@db.example:6379/0",
		"FENCE_REDIS_SENTINEL_URL=redis://:" + secret + "@s1:26379?master_name=m&password=" + secret,
		"FENCE_REDIS_CLUSTER_URL=rediss://bob:" + secret + "@n1:6379?addr=n2:6379",
	}
	for _, cmd := range []string{"exec", "status"} {
		out, errOut, code := fence(t, env, cmd, "--help")
		if code != 0 {
			t.Fatalf("%s --help: exit %d: %s", cmd, code, errOut)
		}
		if strings.Contains(out+errOut, "s3cret") {
			t.Fatalf("%s --help prints the password:\n%s%s", cmd, out, errOut)
		}
		if !strings.Contains(out, "redis://alice:xxxxx@db.example:6379/0") {
			t.Fatalf("%s --help does not show the masked default:\n%s", cmd, out)
		}
	}
}

// TestParseErrorsMaskPasswords: URLs that go-redis refuses, each with the
// password where the error might quote it, from the flag and from the
// environment; exit 2, a message, and no password.
func TestParseErrorsMaskPasswords(t *testing.T) {
	t.Parallel()
	enc := "hunter2%2Fs3cret" // an escaped "/" in the password
	for _, c := range []struct{ flag, env, url string }{
		{"--redis", "FENCE_REDIS_URL", "redis://u:" + secret + "@host:notaport"},
		{"--redis", "FENCE_REDIS_URL", "redis://u:" + secret + "@host/notadb"},
		{"--redis", "FENCE_REDIS_URL", "redis://u:" + secret + "@host\x7f"},
		{"--redis", "FENCE_REDIS_URL", "redis://:" + enc + "@host?db=x"},
		{"--redis", "FENCE_REDIS_URL", "redis://u:hunter2/s3cret@host"},             // unescaped "/"
		{"--redis", "FENCE_REDIS_URL", "redis://:hunter2/s3cret@host:1"},            // url.Parse sees port "hunter2"
		{"--redis", "FENCE_REDIS_URL", "redis://u:hunter2%zzs3cret@host"},           // bad escape
		{"--redis", "FENCE_REDIS_URL", "rediss://u:" + secret + "@host?password=x"}, // unexpected option
		{"--redis", "FENCE_REDIS_URL", "http://u:" + secret + "@host"},
		{"--redis-sentinel", "FENCE_REDIS_SENTINEL_URL", "redis://s:1?master_name=m&addr=u:" + secret + "@x:y:z"},
		{"--redis-sentinel", "FENCE_REDIS_SENTINEL_URL", "redis://s:1?master_name=m&password=" + secret + "&db=zz"},
		{"--redis-sentinel", "FENCE_REDIS_SENTINEL_URL", "redis://:" + secret + "@s:1?master_name=m&dial_timeout=" + secret},
		{"--redis-cluster", "FENCE_REDIS_CLUSTER_URL", "redis://u:" + secret + "@n:1?addr=" + secret + "@:::"},
		{"--redis-cluster", "FENCE_REDIS_CLUSTER_URL", "unix://u:" + secret + "@/tmp/x"},
	} {
		for _, viaEnv := range []bool{false, true} {
			args, env := []string{"status", c.flag, c.url, "x"}, []string(nil)
			if viaEnv {
				args, env = []string{"status", "x"}, []string{c.env + "=" + c.url}
			}
			out, errOut, code := fence(t, env, args...)
			if code != cli.ExitUsage || errOut == "" {
				t.Errorf("%q (env %v): exit %d, stderr %q; want %d with a message", c.url, viaEnv, code, errOut, cli.ExitUsage)
			}
			if strings.Contains(out+errOut, "s3cret") || strings.Contains(out+errOut, "s3cr") {
				t.Errorf("%q (env %v): the password is printed: %s", c.url, viaEnv, errOut)
			}
		}
	}
}

// TestACLUserThroughURL: a password with escaped characters works through
// FENCE_REDIS_URL, and the command does not see it: neither FENCE_REDIS_URL
// nor any other FENCE_ credential variable is in its environment.
func TestACLUserThroughURL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pw := "p@ss/w0rd " + secret
	if err := srv.Client(t).Do(context.Background(), "ACL", "SETUSER", "alice", "on", ">"+pw, "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	u := "redis://alice:p%40ss%2Fw0rd%20" + secret + "@" + srv.Addr
	env := []string{"FENCE_REDIS_URL=" + u, "FENCE_REDIS_PASSWORD=" + secret, "FENCE_POSTGRES_DSN=postgres://u:" + secret + "@h/db", "FENCE_OTHER=kept"}
	out, errOut, code := fence(t, env, "exec", "acl", "--", "env")
	if code != 0 {
		t.Fatalf("exec as an ACL user: exit %d: %s", code, errOut)
	}
	if strings.Contains(out, "s3cret") || strings.Contains(out, "FENCE_REDIS") || strings.Contains(out, "FENCE_POSTGRES_DSN") {
		t.Fatalf("the command's environment carries fence's credentials:\n%s", out)
	}
	for _, want := range []string{"FENCE_TOKEN=", "FENCE_LOCK=acl", "FENCE_OTHER=kept"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the command's environment lacks %s:\n%s", want, out)
		}
	}
	// TLS against a plain server: the handshake fails, without the password.
	tls := "rediss://alice:p%40ss%2Fw0rd%20" + secret + "@" + srv.Addr + "?dial_timeout=1s&max_retries=0"
	_, errOut, code = fence(t, []string{"FENCE_REDIS_URL=" + tls}, "status", "acl")
	if code != cli.ExitUsage || strings.Contains(errOut, "s3cret") || errOut == "" {
		t.Fatalf("rediss:// to a plain server: exit %d, stderr %q", code, errOut)
	}
	// A wrong password: an error, without either password in it.
	bad := "redis://alice:wrong-" + secret + "@" + srv.Addr
	_, errOut, code = fence(t, []string{"FENCE_REDIS_URL=" + bad}, "status", "acl")
	if code != cli.ExitUsage || strings.Contains(errOut, "s3cret") || errOut == "" {
		t.Fatalf("wrong password: exit %d, stderr %q", code, errOut)
	}
}

// TestPoolSizesBounded: a pool size, idle or active connection count out
// of range in any URL flag (a slip such as pool_size=9999999999) is bad
// input: exit 2 with a message naming it, for exec, status and doctor.
// go-redis panicked in NewClient beyond 2^31 - 1, and took gigabytes below
// it (FuzzRedisURL's worker died of it in CI).
func TestPoolSizesBounded(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ flag, url, want string }{
		{"--redis", "redis://u:" + secret + "@127.0.0.1:1?pool_size=9999999999", "pool_size=9999999999"},
		{"--redis", "redis://127.0.0.1:1?pool_size=2000000000", "pool_size=2000000000"},
		{"--redis", "redis://127.0.0.1:1?min_idle_conns=99999999", "min_idle_conns=99999999"},
		{"--redis", "redis://127.0.0.1:1?max_idle_conns=-5", "max_idle_conns=-5"},
		{"--redis-sentinel", "redis://s:1?master_name=m&max_active_conns=20000", "max_active_conns=20000"},
		{"--redis-cluster", "redis://n:1?addr=n2:1&pool_size=10001", "pool_size=10001"},
		{"--redlock", "redis://127.0.0.1:1,redis://127.0.0.1:2?pool_size=9999999999,redis://127.0.0.1:3", "pool_size=9999999999"},
	} {
		for _, cmd := range []string{"exec", "status", "doctor"} {
			args := []string{cmd, c.flag, c.url}
			switch cmd {
			case "exec":
				args = append(args, "x", "--", "true")
			case "status":
				args = append(args, "x")
			}
			out, errOut, code := fence(t, nil, args...)
			if code != cli.ExitUsage || !strings.Contains(errOut, c.want) || !strings.Contains(errOut, "out of range") {
				t.Errorf("%s %s %q: exit %d, stderr %q; want %d naming %s out of range", cmd, c.flag, c.url, code, errOut, cli.ExitUsage, c.want)
			}
			if strings.Contains(out+errOut, "s3cret") {
				t.Errorf("%s %q: the password is printed: %s", cmd, c.url, errOut)
			}
		}
	}
}
