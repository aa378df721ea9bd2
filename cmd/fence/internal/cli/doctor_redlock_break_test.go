package cli_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/silent"
)

// --redlock given but empty is a usage error naming --redlock; it used to
// fall back to --redis's default and audit redis://localhost:6379.
func TestDoctorRedlockEmpty(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"", " ", ",", " , "} {
		_, errOut, code := fence(t, nil, "doctor", "--timeout", "2s", "--redlock", v)
		if code != cli.ExitUsage || !strings.Contains(errOut, "--redlock") || strings.Contains(errOut, "6379") {
			t.Errorf("doctor --redlock %q: exit %d, stderr %q; want exit 2 naming --redlock", v, code, errOut)
		}
	}
}

// fence exec with a lock service's flag given empty (--redlock "$URLS" with
// URLS unset) is a usage error; it used to take the lock on the default
// Redis, another lock service than the one meant, and run the command.
func TestExecBackendFlagEmpty(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"--redlock", "--etcd", "--zookeeper"} {
		for _, v := range []string{"", " "} {
			out, errOut, code := fence(t, nil, "exec", flag, v, "lock:x", "--", "echo", "ran")
			if code != cli.ExitUsage || !strings.Contains(errOut, flag) || strings.Contains(out, "ran") {
				t.Errorf("exec %s %q: exit %d, stdout %q, stderr %q; want exit 2 naming %s", flag, v, code, out, errOut, flag)
			}
		}
	}
}

// One server listed under spellings that differ only in case, a trailing
// slash, a database number or localhost for 127.0.0.1 is one master, not
// several.
func TestDoctorRedlockSpellings(t *testing.T) {
	t.Parallel()
	durable := []string{"--appendonly", "yes", "--appendfsync", "always"}
	a, b := redistest.Start(t, durable...), redistest.Start(t, durable...)
	_, port, _ := net.SplitHostPort(a.Addr)
	for _, alias := range []string{
		"redis://" + a.Addr + "/",
		"REDIS://LOCALHOST:" + port,
		"redis://localhost:" + port + "/3",
	} {
		urls := redisURL(a) + "," + redisURL(b) + "," + alias
		out, errOut, code := fence(t, nil, "doctor", "--timeout", "5s", "--redlock", urls)
		if code != cli.ExitDoctorCritical || !strings.Contains(out, "redlock-not-independent") {
			t.Errorf("doctor --redlock %s: exit %d, stdout %q, stderr %q; want redlock-not-independent", urls, code, out, errOut)
		}
	}
}

// A password with a comma (legal in a URL's user information) in a
// --redlock list: the list splits there, and neither half of the password
// is printed.
func TestDoctorRedlockCommaInPassword(t *testing.T) {
	t.Parallel()
	a := redistest.Start(t)
	for _, urls := range []string{
		"redis://app:s3cretA,s3cretB@" + a.Addr + "," + redisURL(a),
		redisURL(a) + ",redis://:s3cretA,s3cretB@" + a.Addr,
	} {
		for _, sub := range [][]string{{"doctor", "--timeout", "2s"}, {"status"}, {"exec"}} {
			args := append(append([]string{}, sub...), "--redlock", urls)
			if sub[0] != "doctor" {
				args = append(args, "lock:x")
			}
			if sub[0] == "exec" {
				args = append(args, "--", "true")
			}
			out, errOut, _ := fence(t, nil, args...)
			if strings.Contains(out+errOut, "s3cret") {
				t.Errorf("fence %v printed a password: stdout %q, stderr %q", args, out, errOut)
			}
		}
	}
	// --etcd's list likewise (no etcd is needed to see the parse error).
	for _, eps := range []string{"http://app:s3cretA,s3cretB@127.0.0.1:1", "127.0.0.1:1,http://app:s3cretA,s3cretB@127.0.0.1:1"} {
		args := []string{"exec", "--etcd", eps, "lock:x", "--", "true"}
		out, errOut, _ := fence(t, nil, args...)
		if strings.Contains(out+errOut, "s3cret") {
			t.Errorf("fence %v printed a password: stdout %q, stderr %q", args, out, errOut)
		}
	}
}

// A black hole (accepts, never answers) among Redlock masters: doctor
// finishes within --timeout with node-unreachable (exit 1 when the rest is
// clean); all black holes, exit 2 within --timeout. Passwords are printed
// nowhere, in text or JSON.
func TestDoctorRedlockBlackHole(t *testing.T) {
	t.Parallel()
	hole := silent.Addr(t)
	durable := []string{"--appendonly", "yes", "--appendfsync", "always"}
	a, b := redistest.Start(t, durable...), redistest.Start(t, durable...)
	for _, c := range []struct {
		urls string
		code int
	}{
		{redisURL(a) + ",redis://:s3cretpw@" + hole + "," + redisURL(b), cli.ExitDoctorWarning},
		{"redis://app:s3cretpw@" + hole + ",redis://:s3cretpw@" + hole + "/1,redis://" + hole + "?password=s3cretpw", cli.ExitUsage},
	} {
		for _, format := range [][]string{nil, {"--json"}} {
			start := time.Now()
			args := append(append([]string{"doctor", "--timeout", "2s"}, format...), "--redlock", c.urls)
			out, errOut, code := fence(t, nil, args...)
			took := time.Since(start)
			if code != c.code || took > 4*time.Second || strings.Contains(out+errOut, "s3cret") {
				t.Errorf("doctor %v: exit %d (want %d) after %v, stdout %q, stderr %q", args, code, c.code, took, out, errOut)
			}
			if c.code == cli.ExitDoctorWarning && !strings.Contains(out, hole) {
				t.Errorf("doctor %v: the black hole is not named: %q", args, out)
			}
		}
	}
}
