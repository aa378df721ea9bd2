package cli_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	fencelib "github.com/fencekit/fence"
	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// redlockURLs starts n servers and returns them with their URL list.
func redlockURLs(t *testing.T, n int) ([]*redistest.Server, string) {
	var srvs []*redistest.Server
	var urls []string
	for range n {
		s := redistest.Start(t)
		srvs = append(srvs, s)
		urls = append(urls, redisURL(s))
	}
	return srvs, strings.Join(urls, ",")
}

func TestExecRedlock(t *testing.T) {
	t.Parallel()
	srvs, urls := redlockURLs(t, 3)
	out, errOut, code := fence(t, nil, "exec", "--redlock", urls, "job", "--", "sh", "-c", `echo "$FENCE_TOKEN"; env`)
	if code != 0 {
		t.Fatalf("exec --redlock: exit %d: %s", code, errOut)
	}
	lines := strings.Split(out, "\n")
	if tok, err := strconv.ParseInt(lines[0], 10, 64); err != nil || tok <= 0 {
		t.Fatalf("FENCE_TOKEN = %q, want a positive integer", lines[0])
	}
	// From the environment; the command does not inherit it.
	out, errOut, code = fence(t, []string{"FENCE_REDLOCK_URLS=" + urls}, "exec", "job", "--", "env")
	if code != 0 {
		t.Fatalf("exec with FENCE_REDLOCK_URLS: exit %d: %s", code, errOut)
	}
	if strings.Contains(out, "FENCE_REDLOCK_URLS") || !strings.Contains(out, "FENCE_LOCK=job") {
		t.Fatalf("the command's environment:\n%s", out)
	}
	// Released each time: free on every node.
	out, errOut, code = fence(t, nil, "status", "--redlock", urls, "job")
	if code != 0 || !strings.HasPrefix(out, "job: free on 0 of 3 nodes (quorum 2), 3 reached") {
		t.Fatalf("status --redlock after exec: exit %d: %s%s", code, out, errOut)
	}

	// Held by another owner: exit 75 within the wait budget; status shows it.
	cs := make([]redis.UniversalClient, len(srvs))
	for i, s := range srvs {
		cs[i] = s.Client(t)
	}
	l, err := redlock.New(cs, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Acquire(context.Background(), "job", fencelib.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	_, errOut, code = fence(t, nil, "exec", "--redlock", urls, "--wait", "300ms", "job", "--", "true")
	if code != cli.ExitNotAcquired {
		t.Fatalf("exec on a held lock: exit %d (%s), want %d", code, errOut, cli.ExitNotAcquired)
	}
	out, errOut, code = fence(t, nil, "status", "--redlock", urls, "job")
	if code != 0 || !strings.HasPrefix(out, "job: held on 3 of 3 nodes") || strings.Count(out, "held, ") != 3 {
		t.Fatalf("status --redlock of a held lock: exit %d: %s%s", code, out, errOut)
	}
	out, _, code = fence(t, nil, "status", "--json", "--redlock", urls, "job")
	if code != 0 || !strings.Contains(out, `"held_on":3`) || !strings.Contains(out, strconv.FormatInt(int64(lease.Token()), 10)) {
		t.Fatalf("status --json --redlock: exit %d: %s", code, out)
	}

	// Two of three nodes gone: no quorum, exit 2 with a message.
	srvs[0].Kill()
	srvs[1].Kill()
	_, errOut, code = fence(t, nil, "exec", "--redlock", urls, "other", "--", "true")
	if code != cli.ExitUsage || !strings.Contains(errOut, "no quorum") {
		t.Fatalf("exec with 2 of 3 nodes down: exit %d (%s), want %d and no quorum", code, errOut, cli.ExitUsage)
	}
	if _, errOut, code = fence(t, nil, "status", "--redlock", urls, "job"); code != cli.ExitUsage || !strings.Contains(errOut, "quorum") {
		t.Fatalf("status with 2 of 3 nodes down: exit %d (%s)", code, errOut)
	}
}

// TestRedlockMasksPasswords: the URLs' passwords stay out of help and
// errors, and the list parses URL by URL.
func TestRedlockMasksPasswords(t *testing.T) {
	t.Parallel()
	list := "redis://alice:" + secret + "@a.example:6379,redis://:" + secret + "@b.example:6379,redis://c.example:6379"
	for _, cmd := range []string{"exec", "status"} {
		out, errOut, code := fence(t, []string{"FENCE_REDLOCK_URLS=" + list}, cmd, "--help")
		if code != 0 || strings.Contains(out+errOut, "s3cret") {
			t.Fatalf("%s --help: exit %d, prints the password:\n%s%s", cmd, code, out, errOut)
		}
		if !strings.Contains(out, "redis://alice:xxxxx@a.example:6379,redis://:xxxxx@b.example:6379,redis://c.example:6379") {
			t.Fatalf("%s --help does not show the masked default:\n%s", cmd, out)
		}
	}
	for _, bad := range []string{
		"redis://a:1,redis://u:" + secret + "@host:notaport",
		"redis://u:" + secret + "@host/notadb,redis://b:1",
		"redis://u:" + secret + "@a:1,,redis://b:1",
		"redis://u:" + secret + "@a:1,redis://u:" + secret + "@a:1?password=" + secret + "&x=1",
	} {
		for _, viaEnv := range []bool{false, true} {
			args, env := []string{"status", "--redlock", bad, "x"}, []string(nil)
			if viaEnv {
				args, env = []string{"status", "x"}, []string{"FENCE_REDLOCK_URLS=" + bad}
			}
			out, errOut, code := fence(t, env, args...)
			if code != cli.ExitUsage || errOut == "" {
				t.Errorf("%q (env %v): exit %d, stderr %q; want %d with a message", bad, viaEnv, code, errOut, cli.ExitUsage)
			}
			if strings.Contains(out+errOut, "s3cr") {
				t.Errorf("%q (env %v): the password is printed: %s", bad, viaEnv, errOut)
			}
		}
	}
	// A wrong password on a live node: refused, the password not shown.
	srv := redistest.Start(t)
	if err := srv.Client(t).ConfigSet(context.Background(), "requirepass", "right-"+secret).Err(); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := fence(t, nil, "exec", "--redlock", "redis://:wrong-"+secret+"@"+srv.Addr, "n", "--", "true")
	if code != cli.ExitUsage || strings.Contains(errOut, "s3cr") || errOut == "" {
		t.Fatalf("wrong password: exit %d, stderr %q", code, errOut)
	}
}
