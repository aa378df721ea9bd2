package cli_test

import (
	"strings"
	"testing"
	"time"

	fencelib "github.com/fencekit/fence"
	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
)

// TestExecAcksAndReplicas: --acks and --replicas reach the lock, on a real
// primary with one replica: rules that one replica satisfies acquire, rules
// that need two are refused with 75, and bad values exit 2 with a message
// naming the flag.
func TestExecAcksAndReplicas(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t)
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	url := redisURL(primary)

	for _, flags := range [][]string{
		{"--acks", "1"},
		{"--acks", "all"},
		{"--acks", "ALL", "--replicas", "1"},
		{"--acks", "majority", "--replicas", "1"},
		{"--acks", "1", "--replicas", "2"},
		{"--no-replica-sync"},
	} {
		args := append(append([]string{"exec", "--redis", url}, flags...), "n", "--", "true")
		if _, errOut, code := fence(t, nil, args...); code != 0 {
			t.Errorf("%v: exit %d (%s), want 0: one replica suffices", flags, code, errOut)
		}
	}
	for _, flags := range [][]string{
		{"--acks", "2"},
		{"--acks", "all", "--replicas", "2"},
		{"--acks", "majority", "--replicas", "3"},
	} {
		args := append(append([]string{"exec", "--redis", url}, flags...), "n", "--", "true")
		_, errOut, code := fence(t, nil, args...)
		if code != cli.ExitNotAcquired || !strings.Contains(errOut, "replica") {
			t.Errorf("%v: exit %d (%s), want %d: one replica cannot satisfy it", flags, code, errOut, cli.ExitNotAcquired)
		}
	}
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--acks", "0"}, "--acks"},
		{[]string{"--acks", "-1"}, "--acks"},
		{[]string{"--acks", "-2"}, "--acks"},
		{[]string{"--acks", "many"}, "--acks"},
		{[]string{"--acks", ""}, "--acks"},
		{[]string{"--acks", " 1"}, "--acks"},
		{[]string{"--acks", "99999999999999999999"}, "--acks"},
		{[]string{"--replicas", "-1"}, "--replicas"},
		{[]string{"--replicas", "x"}, "--replicas"},
		{[]string{"--replicas", "99999999999999999999"}, "--replicas"},
		{[]string{"--acks", "3", "--replicas", "2"}, "--acks 3 is more than --replicas 2"},
		{[]string{"--acks", "all", "--no-replica-sync"}, "--no-replica-sync"},
	} {
		for _, sub := range []string{"exec", "status"} {
			args := append(append([]string{sub, "--redis", url}, c.flags...), "n")
			if sub == "exec" {
				args = append(args, "--", "true")
			}
			_, errOut, code := fence(t, nil, args...)
			if code != cli.ExitUsage || !strings.Contains(errOut, c.want) {
				t.Errorf("%s %v: exit %d (%q), want %d naming %q", sub, c.flags, code, errOut, cli.ExitUsage, c.want)
			}
		}
	}
	if out, errOut, code := fence(t, nil, "status", "--redis", url, "--acks", "majority", "--replicas", "1", "n"); code != 0 || !strings.Contains(out, "free") {
		t.Fatalf("status with --acks and --replicas: exit %d, %q %q", code, out, errOut)
	}
}

// TestExecTTLBelowMinimum: a --ttl the library refuses (fence.ValidateTTL)
// exits 2 with a message naming --ttl, before fence connects anywhere;
// the smallest accepted one among the candidates runs a quick command
// through. Issue 11 item 6 (the library's minimum TTL) is another
// engineer's change: until it lands, 1ms is accepted and its lease ends
// before it starts, so the second half is skipped while ValidateTTL
// accepts 1ms.
func TestExecTTLBelowMinimum(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	candidates := []time.Duration{time.Microsecond, 999 * time.Microsecond, time.Millisecond, 2 * time.Millisecond,
		5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond,
		200 * time.Millisecond, 500 * time.Millisecond, time.Second}
	var minOK time.Duration
	for _, d := range candidates {
		if fencelib.ValidateTTL(d) == nil {
			minOK = d
			break
		}
		// A dead address: the refusal must come before any connection.
		_, errOut, code := fence(t, nil, "exec", "--redis", "redis://127.0.0.1:1", "--ttl", d.String(), "n", "--", "true")
		if code != cli.ExitUsage || !strings.Contains(errOut, "--ttl "+d.String()) || !strings.Contains(errOut, "invalid option") {
			t.Errorf("--ttl %v: exit %d (%q), want %d naming --ttl", d, code, errOut, cli.ExitUsage)
		}
	}
	if minOK == 0 {
		t.Fatal("ValidateTTL refuses every candidate up to 1s")
	}
	if minOK <= time.Millisecond {
		t.Fatalf("the library accepts a TTL of %v: a lease that short ends before it starts (fence.MinTTL)", minOK)
	}
	// A lease of the smallest TTL is granted: the command runs with its
	// token, or, since starting a process can take longer than the few
	// milliseconds such a lease lasts (seen under make test's load: the
	// lease ended before sh had printed), exec says the lease was lost
	// (exit 76), and the command got SIGTERM.
	out, errOut, code := fence(t, nil, "exec", "--redis", redisURL(srv), "--ttl", minOK.String(), "n", "--", "sh", "-c", `echo "token=$FENCE_TOKEN"`)
	switch {
	case code == cli.ExitLeaseLost && strings.Contains(errOut, "lost"):
	case code == 0:
		if !strings.Contains(out, "token=") || strings.Contains(out, "token=\n") {
			t.Fatalf("--ttl %v, the smallest accepted: exit 0 but the command did not run with a token: stdout %q, stderr %q", minOK, out, errOut)
		}
	default:
		t.Fatalf("--ttl %v, the smallest accepted: exit %d (%s), want 0, or %d when the lease ended first", minOK, code, errOut, cli.ExitLeaseLost)
	}
}
