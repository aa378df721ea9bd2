package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/refused"
)

func TestDoctorExitStatus(t *testing.T) {
	t.Parallel()
	durable := []string{"--appendonly", "yes", "--appendfsync", "always"}
	clean := redistest.Start(t, durable...)
	weak := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "everysec")
	off := redistest.Start(t)
	for _, c := range []struct {
		srv  *redistest.Server
		code int
		out  string
	}{
		{clean, 0, "INFO      no-replicas"},
		{weak, cli.ExitDoctorWarning, "WARNING   appendfsync"},
		{off, cli.ExitDoctorCritical, "CRITICAL  persistence-off"},
	} {
		out, errOut, code := fence(t, nil, "doctor", "--redis", redisURL(c.srv))
		if code != c.code || !strings.Contains(out, c.out) || errOut != "" {
			t.Errorf("doctor on %s: exit %d (want %d), stdout %q, stderr %q", c.srv.Addr, code, c.code, out, errOut)
		}
	}

	out, _, code := fence(t, nil, "doctor", "--json", "--redis", redisURL(off))
	var report struct {
		Worst    string
		Findings []struct{ ID, Severity, Node, Why, Fix string }
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil || code != cli.ExitDoctorCritical {
		t.Fatalf("doctor --json: exit %d, %v, %q", code, err, out)
	}
	f := report.Findings[0]
	if report.Worst != "critical" || f.ID != "persistence-off" || f.Severity != "critical" || f.Node != off.Addr || f.Why == "" || f.Fix == "" {
		t.Fatalf("doctor --json: %+v", report)
	}
	out, _, _ = fence(t, nil, "doctor", "--json", "--redis", redisURL(clean), "--acks", "all")
	if !strings.Contains(out, `"worst":"info"`) {
		t.Fatalf("doctor --json on a clean server: %q", out)
	}
}

func TestDoctorUnreachableMasksPassword(t *testing.T) {
	t.Parallel()
	addr := refused.Addr(t)
	start := time.Now()
	_, errOut, code := fence(t, nil, "doctor", "--timeout", "2s", "--redis", "redis://app:s3cretpw@"+addr)
	if code != cli.ExitUsage || strings.Contains(errOut, "s3cretpw") || !strings.Contains(errOut, "unreachable") {
		t.Fatalf("doctor on a closed port: exit %d, stderr %q", code, errOut)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("doctor on a closed port took %v", took)
	}
	if _, errOut, code := fence(t, nil, "doctor", "--redis-sentinel", "redis://"+addr); code != cli.ExitUsage || !strings.Contains(errOut, "master_name") {
		t.Fatalf("sentinel URL without master_name: exit %d, %q", code, errOut)
	}
}

func TestDoctorRedlock(t *testing.T) {
	t.Parallel()
	durable := []string{"--appendonly", "yes", "--appendfsync", "always"}
	a, b, c := redistest.Start(t, durable...), redistest.Start(t, durable...), redistest.Start(t, durable...)
	three := redisURL(a) + "," + redisURL(b) + "," + redisURL(c)
	out, errOut, code := fence(t, nil, "doctor", "--redlock", three)
	if code != 0 || !strings.Contains(out, "no findings") || errOut != "" {
		t.Fatalf("doctor --redlock on 3 durable masters: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// From the environment, as exec takes it: two masters are too few.
	out, errOut, code = fence(t, []string{"FENCE_REDLOCK_URLS=" + redisURL(a) + "," + redisURL(b)}, "doctor", "--json")
	if code != cli.ExitDoctorWarning || !strings.Contains(out, `"id":"redlock-too-few"`) {
		t.Fatalf("doctor with FENCE_REDLOCK_URLS of 2 masters: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// The lease time in the stay-down rule is --watchdog-ttl when given.
	off := redistest.Start(t)
	out, _, code = fence(t, nil, "doctor", "--redlock", three+","+redisURL(off)+","+redisURL(off), "--watchdog-ttl", "9s")
	if code != cli.ExitDoctorCritical || !strings.Contains(out, "redlock-not-independent") || !strings.Contains(out, "redlock-restart") ||
		!strings.Contains(out, "(9s)") {
		t.Fatalf("doctor --redlock with one master twice and no persistence: exit %d, stdout %q", code, out)
	}
	for _, args := range [][]string{
		{"--redlock", three, "--redis-cluster", redisURL(a)},
		{"--redlock", redisURL(a) + ",,"},
		{"--redlock", "redis://app:s3cretpw@" + a.Addr + ",http://x"},
	} {
		_, errOut, code := fence(t, nil, append([]string{"doctor"}, args...)...)
		if code != cli.ExitUsage || errOut == "" || strings.Contains(errOut, "s3cretpw") {
			t.Fatalf("doctor %v: exit %d, stderr %q", args, code, errOut)
		}
	}
}
