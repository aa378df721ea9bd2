package cli_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/refused"
	"github.com/fencekit/fence/internal/silent"
)

// A server that accepts connections and never answers, named by each kind
// of URL with credentials: doctor gives up with exit status 2 within
// --timeout, and prints the credentials nowhere, in text or JSON.
func TestDoctorBlackHoleWithinTimeout(t *testing.T) {
	t.Parallel()
	hole := silent.Addr(t)
	closed := refused.Addr(t)
	for _, args := range [][]string{
		{"--redis", "redis://app:s3cretpw@" + hole},
		{"--redis", "redis://app:s3cretpw@" + hole + "/0?dial_timeout=30s&read_timeout=30s"},
		{"--redis", "rediss://app:s3cretpw@" + hole + "/0?dial_timeout=30s"},
		{"--redis-sentinel", "redis://app:s3cretpw@" + hole + "?master_name=mymaster&sentinel_password=s3cretsent"},
		{"--redis-sentinel", "redis://app:s3cretpw@" + closed + "?master_name=mymaster&addr=" + hole},
		{"--redis-cluster", "redis://app:s3cretpw@" + hole + "?addr=" + closed},
	} {
		for _, format := range [][]string{nil, {"--json"}} {
			start := time.Now()
			out, errOut, code := fence(t, nil, append(append([]string{"doctor", "--timeout", "1s"}, format...), args...)...)
			took := time.Since(start)
			if code != cli.ExitUsage {
				t.Errorf("doctor %v %v on a black hole: exit %d, stdout %q, stderr %q", format, args, code, out, errOut)
			}
			// 4 s, plus 2 s for a race-built process's start and exit
			// on a loaded machine (--redis-cluster took 4.4 s in a
			// fresh-clone run with other packages' tests at once, as
			// execWait1sLimit's cases did); the regressions took 25 s
			// and more.
			if took > 6*time.Second {
				t.Errorf("doctor %v %v on a black hole with --timeout 1s took %v", format, args, took)
			}
			if all := out + errOut; strings.Contains(all, "s3cret") {
				t.Errorf("doctor %v %v printed a password: %q", format, args, all)
			}
		}
	}
}

// A Sentinel URL whose master_name the sentinels do not know is an error
// that names the master and says the sentinels do not know it, promptly;
// credentials the sentinels refuse are reported as refused (they used to
// read "no sentinel answered" either way), and not printed.
func TestDoctorSentinelWrongMaster(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t)
	sentinels := redistest.StartSentinels(t, primary, 1)
	redistest.WaitSentinelsReady(t, sentinels, 0)
	addr := sentinels.Addrs()[0]
	for _, c := range []struct{ url, want string }{
		{"redis://" + addr + "?master_name=nosuchmaster", "No such master"},
		{"redis://app:s3cretpw@" + addr + "?master_name=" + sentinels.Master, "WRONGPASS"},
	} {
		start := time.Now()
		out, errOut, code := fence(t, nil, "doctor", "--timeout", "5s", "--redis-sentinel", c.url)
		if code != cli.ExitUsage || !strings.Contains(errOut, c.want) || strings.Contains(out+errOut, "s3cret") {
			t.Errorf("doctor --redis-sentinel %s: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.url, code, out, errOut, c.want)
		}
		if took := time.Since(start); took > 4*time.Second {
			t.Errorf("doctor --redis-sentinel %s took %v", c.url, took)
		}
	}
}

// A cluster with one master down, listed first in the URL: doctor reports
// within --timeout, the down node is one finding, not a hang.
func TestDoctorClusterNodeDown(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	addrs := cluster.Addrs()
	cluster.Servers[2].Kill()
	start := time.Now()
	out, errOut, code := fence(t, nil, "doctor", "--timeout", "5s", "--redis-cluster", "redis://"+addrs[2]+"?addr="+addrs[0]+"&addr="+addrs[1])
	if took := time.Since(start); took > 7*time.Second {
		t.Fatalf("doctor on a cluster with a node down took %v", took)
	}
	// The ID column is as wide as the longest ID shown (cluster-node-timeout).
	if code != cli.ExitDoctorCritical || len(regexp.MustCompile(`node-unreachable +`+regexp.QuoteMeta(addrs[2])).FindAllString(out, -1)) != 1 {
		t.Fatalf("doctor on a cluster with a node down: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	t.Logf("stdout:\n%s", out)
}

// A server with a password: neither the right password nor a wrong one is
// printed, whether the doctor gets in or is refused.
func TestDoctorPasswordNotPrinted(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	if err := srv.Client(t).Do(context.Background(), "ACL", "SETUSER", "alice", "on", ">s3cretright", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pass string
		code int
	}{{"s3cretright", cli.ExitDoctorCritical}, {"s3cretwrong", cli.ExitUsage}} {
		for _, format := range [][]string{nil, {"--json"}} {
			args := append(append([]string{"doctor", "--timeout", "5s"}, format...), "--redis", "redis://alice:"+c.pass+"@"+srv.Addr)
			out, errOut, code := fence(t, nil, args...)
			if code != c.code || strings.Contains(out+errOut, "s3cret") {
				t.Errorf("doctor %v with password %s: exit %d (want %d), stdout %q, stderr %q", format, c.pass, code, c.code, out, errOut)
			}
		}
	}
}

// A black hole listed among working sentinels, or among a cluster's
// nodes, costs part of --timeout, not all of it: the rest is audited and
// the black hole reported.
func TestDoctorBlackHoleAmongNodes(t *testing.T) {
	t.Parallel()
	hole := silent.Addr(t)
	primary := redistest.Start(t)
	sentinels := redistest.StartSentinels(t, primary, 1)
	redistest.WaitSentinelsReady(t, sentinels, 0)
	cluster := redistest.StartCluster(t, 3)
	ca := cluster.Addrs()
	for _, args := range [][]string{
		{"--redis-sentinel", "redis://" + hole + "?master_name=" + sentinels.Master + "&addr=" + sentinels.Addrs()[0]},
		{"--redis-cluster", "redis://" + hole + "?addr=" + ca[0] + "&addr=" + ca[1] + "&addr=" + ca[2]},
	} {
		start := time.Now()
		out, errOut, code := fence(t, nil, append([]string{"doctor", "--timeout", "3s"}, args...)...)
		took := time.Since(start)
		if code != cli.ExitDoctorCritical || !strings.Contains(out, hole) || took > 5*time.Second {
			t.Errorf("doctor %v with a black hole listed: exit %d after %v, stdout %q, stderr %q", args, code, took, out, errOut)
		}
		t.Logf("%v: %v", args[0], took)
	}
}
