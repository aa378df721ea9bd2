package cli_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redisserver"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/silent"
	"github.com/redis/go-redis/v9"
)

// trustCA is the environment that makes fence (Go on Linux) trust the test
// CA in ca: SSL_CERT_FILE names the roots in place of the system's.
func trustCA(caFile string) []string { return []string{"SSL_CERT_FILE=" + caFile} }

// TestTLSExecStatusDoctor: exec, status and doctor with a rediss:// URL to
// a redis-server that speaks TLS alone, with a password, trusting the
// private CA through SSL_CERT_FILE. The doctor reads the primary's TLS
// replica too (over TLS), and no output names the password.
func TestTLSExecStatusDoctor(t *testing.T) {
	t.Parallel()
	ca := redistest.NewTLS(t)
	primary := redistest.StartTLS(t, ca)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	// The password is set once they run: redistest waits for a PING.
	for _, s := range []*redistest.Server{replica, primary} {
		c := s.Client(t)
		if err := c.ConfigSet(context.Background(), "masterauth", "s3cretpw").Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.ConfigSet(context.Background(), "requirepass", "s3cretpw").Err(); err != nil {
			t.Fatal(err)
		}
	}
	url := "rediss://:s3cretpw@" + primary.Addr
	env := trustCA(ca.CAFile)
	check := func(what, out, errOut string, code, want int) {
		t.Helper()
		t.Logf("%s: exit %d\nstdout: %s\nstderr: %s", what, code, out, errOut)
		if code != want {
			t.Errorf("%s: exit %d, want %d; stdout %q, stderr %q", what, code, want, out, errOut)
		}
		if strings.Contains(out+errOut, "s3cretpw") {
			t.Errorf("%s printed the password: %q %q", what, out, errOut)
		}
	}
	out, errOut, code := fence(t, env, "exec", "--redis", url, "lock:payment:1001", "--", "sh", "-c", `echo "$FENCE_TOKEN"`)
	check("exec", out, errOut, code, 0)
	out, errOut, code = fence(t, env, "status", "--redis", url, "lock:payment:1001")
	check("status", out, errOut, code, 0)
	if !strings.Contains(out, "free") || !strings.Contains(out, "1 connected") {
		t.Errorf("status over TLS: %q, want the lock free and 1 replica connected", out)
	}
	out, errOut, code = fence(t, env, "doctor", "--redis", url)
	check("doctor", out, errOut, code, cli.ExitDoctorCritical)
	if strings.Contains(out+errOut, "unreachable") || strings.Contains(out+errOut, "did not answer") || !strings.Contains(out, replica.Addr) {
		t.Errorf("doctor over TLS did not read the replica %s: stdout %q, stderr %q", replica.Addr, out, errOut)
	}
}

// TestTLSUntrustedCertificate: a rediss:// URL to a server whose
// certificate does not verify (a CA fence does not trust) is exit 2 for
// exec, status and doctor, with an error that names the certificate's
// verification failure, not a server that did not answer; and it comes at
// once, not after --wait or --timeout.
func TestTLSUntrustedCertificate(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTLS(t, redistest.NewTLS(t))
	other := redistest.NewTLS(t) // trusted, but not the server's CA
	url := "rediss://app:s3cretpw@" + srv.Addr
	for _, args := range [][]string{
		{"exec", "--wait", "5s", "--redis", url, "lock:x", "--", "true"},
		{"status", "--redis", url, "lock:x"},
		{"doctor", "--redis", url},
	} {
		start := time.Now()
		out, errOut, code := fence(t, trustCA(other.CAFile), args...)
		took := time.Since(start)
		t.Logf("%s: exit %d after %v: %s", args[0], code, took, errOut)
		if code != cli.ExitUsage || !strings.Contains(errOut, "certificate") || strings.Contains(errOut, "did not answer") ||
			strings.Contains(errOut, "no answer") || strings.Contains(out+errOut, "s3cretpw") {
			t.Errorf("%s on an untrusted certificate: exit %d, stdout %q, stderr %q; want %d naming the certificate", args[0], code, out, errOut, cli.ExitUsage)
		}
		if took > 4*time.Second {
			t.Errorf("%s on an untrusted certificate took %v", args[0], took)
		}
	}
}

// TestTLSBlackHole: a rediss:// URL naming a listener that accepts and
// never answers the TLS handshake keeps exec's --wait bound, and status's
// and doctor's --timeout.
func TestTLSBlackHole(t *testing.T) {
	// Not parallel: it measures bounds of seconds (see TestExecBlackHoleWithinWait).
	hole := "rediss://" + silent.Addr(t)
	for _, c := range []struct {
		args  []string
		limit time.Duration
	}{
		{[]string{"exec", "--wait", "1s", "--redis", hole, "lock:x", "--", "true"}, execWait1sLimit},
		{[]string{"status", "--timeout", "1s", "--redis", hole, "lock:x"}, 4 * time.Second},
		{[]string{"doctor", "--timeout", "2s", "--redis", hole}, 5 * time.Second},
		{[]string{"status", "--timeout", "1s", "--redis-sentinel", hole + "?master_name=mymaster", "lock:x"}, 4 * time.Second},
		{[]string{"exec", "--wait", "1s", "--redis-sentinel", hole + "?master_name=mymaster", "lock:x", "--", "true"}, execWait1sLimit},
	} {
		start := time.Now()
		out, errOut, code := fence(t, nil, c.args...)
		took := time.Since(start)
		t.Logf("%v: exit %d after %v: %s", c.args, code, took, errOut)
		if code != cli.ExitUsage || took > c.limit {
			t.Errorf("%v on a TLS black hole: exit %d after %v, want %d within %v; stdout %q, stderr %q", c.args, code, took, cli.ExitUsage, c.limit, out, errOut)
		}
	}
}

// TestTLSSentinel: --redis-sentinel with a rediss:// URL, the sentinels, the
// primary and its replica all speaking TLS alone: exec, status and doctor.
func TestTLSSentinel(t *testing.T) {
	t.Parallel()
	ca := redistest.NewTLS(t)
	primary := redistest.StartTLS(t, ca)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	s := redistest.StartSentinels(t, primary, 3)
	redistest.WaitSentinelsReady(t, s, 1)
	url := "rediss://" + s.Addrs()[0] + "?master_name=" + s.Master + "&addr=" + s.Addrs()[1] + "&addr=" + s.Addrs()[2]
	env := trustCA(ca.CAFile)
	out, errOut, code := fence(t, env, "exec", "--redis-sentinel", url, "lock:x", "--", "echo", "ran")
	t.Logf("exec: %d %q %q", code, out, errOut)
	if code != 0 || out != "ran\n" {
		t.Errorf("exec over TLS sentinels: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = fence(t, env, "status", "--redis-sentinel", url, "lock:x")
	t.Logf("status: %d %q %q", code, out, errOut)
	if code != 0 || !strings.Contains(out, "free") {
		t.Errorf("status over TLS sentinels: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = fence(t, env, "doctor", "--redis-sentinel", url)
	t.Logf("doctor: %d %q %q", code, out, errOut)
	if code == cli.ExitUsage || strings.Contains(out+errOut, "unreachable") || !strings.Contains(out, replica.Addr) {
		t.Errorf("doctor over TLS sentinels: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestTLSClientCertificateRequired: a server that asks for client
// certificates (--tls-auth-clients yes), which a rediss:// URL cannot give:
// exit 2 naming the certificate, not a server that did not answer.
func TestTLSClientCertificateRequired(t *testing.T) {
	t.Parallel()
	ca := redistest.NewTLS(t)
	srv := redistest.StartTLS(t, ca, "--tls-auth-clients", "yes")
	for _, args := range [][]string{
		{"exec", "--wait", "5s", "--redis", "rediss://" + srv.Addr, "lock:x", "--", "true"},
		{"status", "--redis", "rediss://" + srv.Addr, "lock:x"},
		{"doctor", "--redis", "rediss://" + srv.Addr},
	} {
		start := time.Now()
		out, errOut, code := fence(t, trustCA(ca.CAFile), args...)
		took := time.Since(start)
		t.Logf("%s: exit %d after %v: %s", args[0], code, took, errOut)
		if code != cli.ExitUsage || !strings.Contains(errOut, "certificate") || took > 4*time.Second {
			t.Errorf("%s on a server requiring a client certificate: exit %d after %v, stdout %q, stderr %q; want %d naming the certificate", args[0], code, took, out, errOut, cli.ExitUsage)
		}
	}
}

// issue is ca.Issue in a temp dir of t's: a certificate of ca's naming only
// names.
func issue(t *testing.T, ca *redisserver.TLS, names ...string) *redisserver.TLS {
	t.Helper()
	c, err := ca.Issue(t.TempDir(), names...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// localhostURL is the rediss:// URL of srv by the name localhost.
func localhostURL(srv *redistest.Server) string { return "rediss://localhost:" + srv.Port() }

// TestTLSDiscoveredNodesVerifiedByTheirOwnName: each server's certificate
// names the address it is reached at, as a deployment's certificates
// usually do: the primary, named in the URL as localhost, has one for
// localhost alone; its replica, which the doctor finds at 127.0.0.1 in
// INFO replication, and the primary the sentinels name, at 127.0.0.1, have
// one for 127.0.0.1 alone. A node found through another must be verified
// against the name it is dialled by, not against the URL's host.
func TestTLSDiscoveredNodesVerifiedByTheirOwnName(t *testing.T) {
	t.Parallel()
	ca := redistest.NewTLS(t)
	env := trustCA(ca.CAFile)
	t.Run("doctor-replica", func(t *testing.T) {
		primary := redistest.StartTLS(t, issue(t, ca, "localhost"))
		replica := redistest.StartTLS(t, issue(t, ca, "127.0.0.1"), "--replicaof", primary.Host(), primary.Port())
		redistest.WaitReplicated(t, primary, 1)
		out, errOut, code := fence(t, env, "doctor", "--redis", localhostURL(primary))
		t.Logf("doctor: exit %d\n%s%s", code, out, errOut)
		if strings.Contains(out+errOut, "unreachable") || !strings.Contains(out, "persistence-off  "+replica.Addr) {
			t.Errorf("doctor did not read the replica %s over TLS: exit %d, stdout %q, stderr %q", replica.Addr, code, out, errOut)
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		primary := redistest.StartTLS(t, issue(t, ca, "127.0.0.1"))
		// The sentinel gets the certificate of the primary it is given:
		// one for localhost alone, and the real primary's address.
		asLocalhost := &redistest.Server{Server: &redisserver.Server{Addr: primary.Addr, TLS: issue(t, ca, "localhost")}}
		s := redistest.StartSentinels(t, asLocalhost, 1)
		url := localhostURL(s.Servers[0]) + "?master_name=" + s.Master
		out, errOut, code := fence(t, env, "exec", "--redis-sentinel", url, "lock:x", "--", "echo", "ran")
		t.Logf("exec: exit %d %q %q", code, out, errOut)
		if code != 0 {
			t.Errorf("exec --redis-sentinel: exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})
}

// TestTLSDoctorReplicaCertificateRefused: a replica whose certificate the
// doctor's host does not trust (another CA) answers the TLS handshake;
// the doctor's finding must say that the handshake failed, naming the
// verification failure, not that the replica did not answer.
func TestTLSDoctorReplicaCertificateRefused(t *testing.T) {
	t.Parallel()
	ca := redistest.NewTLS(t)
	primary := redistest.StartTLS(t, ca)
	// Its own CA's certificate; trusting the primary's CA, to replicate.
	replica := redistest.StartTLS(t, redistest.NewTLS(t), "--replicaof", primary.Host(), primary.Port(), "--tls-ca-cert-file", ca.CAFile)
	redistest.WaitReplicated(t, primary, 1)
	out, errOut, code := fence(t, trustCA(ca.CAFile), "doctor", "--redis", "rediss://"+primary.Addr)
	t.Logf("doctor: exit %d\n%s%s", code, out, errOut)
	if !strings.Contains(out, "node-unreachable  "+replica.Addr) || strings.Contains(out, "did not answer") ||
		!strings.Contains(out, "TLS handshake") || !strings.Contains(out, "certificate") {
		t.Errorf("doctor on a replica with an untrusted certificate: exit %d, stdout %q, stderr %q; want a finding naming the TLS verification failure", code, out, errOut)
	}
}

// TestTLSHelpSaysHowToTrustACA: the README says rediss:// gives TLS; with
// a private CA (the usual case for an internal Redis) every command failed
// with "certificate signed by unknown authority", and neither the help nor
// the README said how to trust one. The help of each command that takes
// --redis names SSL_CERT_FILE (TestTLSExecStatusDoctor shows it works).
func TestTLSHelpSaysHowToTrustACA(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"exec", "status", "doctor"} {
		out, errOut, code := fence(t, nil, c, "--help")
		if code != 0 || !strings.Contains(out, "SSL_CERT_FILE") || !strings.Contains(out, "skip_verify") {
			t.Errorf("fence %s --help: exit %d, no word of SSL_CERT_FILE or skip_verify for rediss://; stdout %q, stderr %q", c, code, out, errOut)
		}
		for _, f := range []string{"--redis-tls-cert", "--redis-tls-key", "--redis-tls-ca", "FENCE_REDIS_TLS_CERT"} {
			if !strings.Contains(out, f) {
				t.Errorf("fence %s --help does not name %s", c, f)
			}
		}
		if strings.Contains(out, "not supported") {
			t.Errorf("fence %s --help still says client certificates are not supported", c)
		}
	}
}

// mtls is a CA, and a client certificate of its own, for servers run with
// --tls-auth-clients yes.
type mtls struct {
	ca     *redisserver.TLS
	client *redisserver.TLS
}

func newMTLS(t *testing.T) mtls {
	ca := redistest.NewTLS(t)
	return mtls{ca: ca, client: issue(t, ca, "fence client")}
}

// flags are the TLS flags that present m's client certificate and trust its
// CA (no SSL_CERT_FILE needed).
func (m mtls) flags() []string {
	return []string{"--redis-tls-cert", m.client.CertFile, "--redis-tls-key", m.client.KeyFile, "--redis-tls-ca", m.ca.CAFile}
}

// withFlags is args with flags inserted before the "--" that ends fence's
// own arguments, if any.
func withFlags(args []string, flags ...string) []string {
	i := slices.Index(args, "--")
	if i < 0 {
		i = len(args)
	}
	return slices.Concat(args[:i], flags, args[i:])
}

// refusesWithoutCert fails t unless the TLS server at addr refuses a
// client that presents no certificate: the check that the server under test
// does ask for one. With TLS 1.3 the client's handshake ends before the
// server has checked it, so the refusal reaches the client either as the
// server's "certificate required" alert or, when the server has already
// closed the connection by the time the PING is written, as a reset.
func refusesWithoutCert(t *testing.T, m mtls, addr string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, DialerRetries: 1, MaxRetries: -1,
		TLSConfig: &tls.Config{RootCAs: m.ca.Pool, MinVersion: tls.VersionTLS12}})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := c.Ping(ctx).Err()
	refused := err != nil && (strings.Contains(err.Error(), "certificate") ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
	if !refused {
		t.Fatalf("%s answered a client without a certificate: %v", addr, err)
	}
}

// authClients asks a TLS server for a client certificate.
var authClients = []string{"--tls-auth-clients", "yes"}

// TestTLSClientCertificateGiven: a Redis run with tls-auth-clients yes
// needs a client certificate, which no fence flag or URL parameter could
// give (go-redis's ParseURL refuses unknown parameters): every command was
// exit 2, "tls: certificate required". --redis-tls-cert and --redis-tls-key
// (or FENCE_REDIS_TLS_CERT and FENCE_REDIS_TLS_KEY) present one, with the
// CA from SSL_CERT_FILE or --redis-tls-ca; the doctor presents it to the
// primary's replica too, which asks for one as well.
func TestTLSClientCertificateGiven(t *testing.T) {
	t.Parallel()
	m := newMTLS(t)
	srv := redistest.StartTLS(t, m.ca, authClients...)
	replica := redistest.StartReplica(t, srv, authClients...)
	redistest.WaitReplicated(t, srv, 1)
	refusesWithoutCert(t, m, srv.Addr)
	refusesWithoutCert(t, m, replica.Addr)
	url := "rediss://" + srv.Addr
	out, errOut, code := fence(t, trustCA(m.ca.CAFile), "exec", "--redis", url,
		"--redis-tls-cert", m.client.CertFile, "--redis-tls-key", m.client.KeyFile, "lock:x", "--", "echo", "ran")
	if code != 0 || out != "ran\n" {
		t.Errorf("exec with a client certificate, SSL_CERT_FILE: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = fence(t, nil, withFlags([]string{"exec", "--redis", url, "lock:x", "--", "echo", "ran"}, m.flags()...)...)
	if code != 0 || out != "ran\n" {
		t.Errorf("exec with a client certificate, --redis-tls-ca: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	env := []string{"FENCE_REDIS_URL=" + url, "FENCE_REDIS_TLS_CERT=" + m.client.CertFile,
		"FENCE_REDIS_TLS_KEY=" + m.client.KeyFile, "FENCE_REDIS_TLS_CA=" + m.ca.CAFile}
	out, errOut, code = fence(t, env, "status", "lock:x")
	if code != 0 || !strings.Contains(out, "free") || !strings.Contains(out, "1 connected") {
		t.Errorf("status with a client certificate from FENCE_REDIS_TLS_*: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = fence(t, nil, append([]string{"doctor", "--redis", url}, m.flags()...)...)
	t.Logf("doctor: exit %d\n%s%s", code, out, errOut)
	if code == cli.ExitUsage || strings.Contains(out+errOut, "unreachable") || !strings.Contains(out, "persistence-off  "+replica.Addr) {
		t.Errorf("doctor with a client certificate did not read the replica %s: exit %d, stdout %q, stderr %q", replica.Addr, code, out, errOut)
	}
}

// TestTLSClientCertificateSentinel: --redis-sentinel over TLS, the
// sentinels, the primary and its replica all asking for client
// certificates, the CA given by --redis-tls-ca alone: exec, status and
// doctor present the certificate to the sentinels, to the primary they name
// and (the doctor) to the replica.
func TestTLSClientCertificateSentinel(t *testing.T) {
	t.Parallel()
	m := newMTLS(t)
	primary := redistest.StartTLS(t, m.ca, authClients...)
	replica := redistest.StartReplica(t, primary, authClients...)
	redistest.WaitReplicated(t, primary, 1)
	s := redistest.StartSentinels(t, primary, 2, authClients...)
	redistest.WaitSentinelsReady(t, s, 1)
	for _, a := range append(s.Addrs(), primary.Addr, replica.Addr) {
		refusesWithoutCert(t, m, a)
	}
	url := "rediss://" + s.Addrs()[0] + "?master_name=" + s.Master + "&addr=" + s.Addrs()[1]
	out, errOut, code := fence(t, nil, withFlags([]string{"exec", "--redis-sentinel", url, "lock:x", "--", "echo", "ran"}, m.flags()...)...)
	if code != 0 || out != "ran\n" {
		t.Errorf("exec --redis-sentinel with a client certificate: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = fence(t, nil, append([]string{"status", "--redis-sentinel", url, "lock:x"}, m.flags()...)...)
	if code != 0 || !strings.Contains(out, "free") {
		t.Errorf("status --redis-sentinel with a client certificate: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = fence(t, nil, append([]string{"doctor", "--redis-sentinel", url}, m.flags()...)...)
	t.Logf("doctor: exit %d\n%s%s", code, out, errOut)
	if code == cli.ExitUsage || strings.Contains(out+errOut, "unreachable") || !strings.Contains(out, replica.Addr) {
		t.Errorf("doctor --redis-sentinel with a client certificate: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestTLSClientCertificateRedlockCluster: --redlock over three masters and
// --redis-cluster over three nodes, every one asking for client
// certificates: exec, status (Redlock) and doctor present the certificate
// to each.
func TestTLSClientCertificateRedlockCluster(t *testing.T) {
	t.Parallel()
	m := newMTLS(t)
	a, b, c := redistest.StartTLS(t, m.ca, authClients...), redistest.StartTLS(t, m.ca, authClients...), redistest.StartTLS(t, m.ca, authClients...)
	urls := "rediss://" + a.Addr + ",rediss://" + b.Addr + ",rediss://" + c.Addr
	out, errOut, code := fence(t, nil, withFlags([]string{"exec", "--redlock", urls, "lock:x", "--", "echo", "ran"}, m.flags()...)...)
	if code != 0 || out != "ran\n" {
		t.Errorf("exec --redlock with a client certificate: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = fence(t, nil, append([]string{"status", "--redlock", urls, "lock:x"}, m.flags()...)...)
	if code != 0 {
		t.Errorf("status --redlock with a client certificate: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = fence(t, nil, append([]string{"doctor", "--json", "--redlock", urls}, m.flags()...)...)
	if code == cli.ExitUsage || strings.Contains(out, "unreachable") || !strings.Contains(out, c.Addr) {
		t.Errorf("doctor --redlock with a client certificate: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	cl := redistest.StartClusterTLS(t, m.ca, 3, 0)
	for _, n := range cl.Servers {
		// The nodes' own links present their certificates (client auth too).
		if err := n.Client(t).ConfigSet(context.Background(), "tls-auth-clients", "yes").Err(); err != nil {
			t.Fatal(err)
		}
		refusesWithoutCert(t, m, n.Addr)
	}
	url := "rediss://" + cl.Addrs()[0]
	out, errOut, code = fence(t, nil, withFlags([]string{"exec", "--redis-cluster", url, "lock:x", "--", "echo", "ran"}, m.flags()...)...)
	if code != 0 || out != "ran\n" {
		t.Errorf("exec --redis-cluster with a client certificate: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = fence(t, nil, append([]string{"doctor", "--json", "--redis-cluster", url}, m.flags()...)...)
	for _, s := range cl.Servers {
		if !strings.Contains(out, `"node":"`+s.Addr+`"`) {
			t.Errorf("doctor --redis-cluster with a client certificate has no finding on %s", s.Addr)
		}
	}
	if code == cli.ExitUsage || strings.Contains(out, "unreachable") {
		t.Errorf("doctor --redis-cluster with a client certificate: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestTLSDoctorReplicaRefusesClientCertificate: the primary does not ask
// for a client certificate, its replica does: without one given, or with
// one from a CA the replica does not trust, the doctor's finding on the
// replica must name the TLS refusal and say how to present a certificate
// (--redis-tls-cert), not only how to trust the server's.
func TestTLSDoctorReplicaRefusesClientCertificate(t *testing.T) {
	t.Parallel()
	m := newMTLS(t)
	primary := redistest.StartTLS(t, m.ca)
	replica := redistest.StartReplica(t, primary, authClients...)
	redistest.WaitReplicated(t, primary, 1)
	other := redistest.NewTLS(t)
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--redis-tls-ca", m.ca.CAFile}, "certificate required"},
		{[]string{"--redis-tls-ca", m.ca.CAFile, "--redis-tls-cert", other.CertFile, "--redis-tls-key", other.KeyFile}, "unknown certificate authority"},
	} {
		out, errOut, code := fence(t, nil, append([]string{"doctor", "--json", "--redis", "rediss://" + primary.Addr}, c.flags...)...)
		t.Logf("doctor %v: exit %d\n%s%s", c.flags, code, out, errOut)
		var report struct {
			Findings []struct{ ID, Node, Why, Fix string }
		}
		if err := json.Unmarshal([]byte(out), &report); err != nil {
			t.Fatalf("doctor --json: %v: %q", err, out)
		}
		var why, fix string
		for _, f := range report.Findings {
			if f.ID == "node-unreachable" && f.Node == replica.Addr {
				why, fix = f.Why, f.Fix
			}
		}
		if !strings.Contains(why, "TLS handshake") || !strings.Contains(why, c.want) || !strings.Contains(fix, "--redis-tls-cert") {
			t.Errorf("doctor %v, a replica refusing the client certificate: finding why %q, fix %q; want the TLS refusal (%s) and --redis-tls-cert in the fix", c.flags, why, fix, c.want)
		}
	}
	// The same for a sentinel that asks for a client certificate, beside
	// one that does not.
	open := redistest.StartSentinels(t, primary, 1)
	asking := redistest.StartSentinels(t, primary, 1, authClients...)
	url := "rediss://" + open.Addrs()[0] + "?master_name=" + open.Master + "&addr=" + asking.Addrs()[0]
	out, errOut, code := fence(t, nil, "doctor", "--json", "--redis-sentinel", url, "--redis-tls-ca", m.ca.CAFile)
	t.Logf("doctor --redis-sentinel: exit %d\n%s%s", code, out, errOut)
	var report struct {
		Findings []struct{ ID, Why, Fix string }
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("doctor --json: %v: %q", err, out)
	}
	var why, fix string
	for _, f := range report.Findings {
		if f.ID == "sentinel-unreachable" {
			why, fix = f.Why, f.Fix
		}
	}
	if !strings.Contains(why, asking.Addrs()[0]+" failed the TLS handshake") || !strings.Contains(why, "certificate required") ||
		!strings.Contains(fix, "--redis-tls-cert") || strings.Contains(fix, "give every sentinel a certificate") {
		t.Errorf("doctor with a sentinel asking for a client certificate: finding why %q, fix %q; want the TLS refusal and --redis-tls-cert in the fix", why, fix)
	}
}

// TestTLSClientCertificateWrong: a client certificate signed by a CA the
// server does not trust: exit 2 for exec, status and doctor, naming the TLS
// failure, at once rather than after --wait, in one line (go-redis's note on
// each retired connection repeated it up to eight times before).
func TestTLSClientCertificateWrong(t *testing.T) {
	t.Parallel()
	m := newMTLS(t)
	srv := redistest.StartTLS(t, m.ca, authClients...)
	other := redistest.NewTLS(t)
	wrong := []string{"--redis-tls-cert", other.CertFile, "--redis-tls-key", other.KeyFile, "--redis-tls-ca", m.ca.CAFile}
	url := "rediss://" + srv.Addr
	for _, args := range [][]string{
		{"exec", "--wait", "5s", "--redis", url, "lock:x", "--", "true"},
		{"status", "--redis", url, "lock:x"},
		{"doctor", "--redis", url},
	} {
		start := time.Now()
		out, errOut, code := fence(t, nil, withFlags(args, wrong...)...)
		took := time.Since(start)
		t.Logf("%s: exit %d after %v: %s", args[0], code, took, errOut)
		if code != cli.ExitUsage || !strings.Contains(errOut, "tls: ") || !strings.Contains(errOut, "certificate") || took > 4*time.Second ||
			strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s with a client certificate of another CA: exit %d after %v, stdout %q, stderr %q; want %d naming the TLS failure", args[0], code, took, out, errOut, cli.ExitUsage)
		}
	}
}

// TestTLSClientCertificateFlagErrors: TLS flags that cannot work are exit 2
// before any connection (the URLs name a listener that never answers, which
// would hold each command for seconds), naming the flag, the file and why.
func TestTLSClientCertificateFlagErrors(t *testing.T) {
	t.Parallel()
	m := newMTLS(t)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	other := redistest.NewTLS(t) // a key that is not the certificate's
	hole := silent.Addr(t)
	tlsURL, plainURL := "rediss://"+hole, "redis://"+hole
	certKey := []string{"--redis-tls-cert", m.client.CertFile, "--redis-tls-key", m.client.KeyFile}
	for _, c := range []struct {
		env  []string
		args []string
		want []string
	}{
		{nil, []string{"exec", "--redis", tlsURL, "--redis-tls-cert", m.client.CertFile, "lock:x", "--", "true"}, []string{"--redis-tls-cert needs --redis-tls-key"}},
		{nil, []string{"status", "--redis", tlsURL, "--redis-tls-key", m.client.KeyFile, "lock:x"}, []string{"--redis-tls-key needs --redis-tls-cert"}},
		{[]string{"FENCE_REDIS_TLS_CERT=" + m.client.CertFile}, []string{"doctor", "--redis", tlsURL}, []string{"FENCE_REDIS_TLS_CERT", "needs --redis-tls-key"}},
		{nil, append([]string{"exec", "--redis", plainURL, "lock:x"}, append(certKey, "--", "true")...), []string{"--redis-tls-cert needs a rediss:// URL", plainURL}},
		{nil, []string{"status", "--redis", plainURL, "--redis-tls-ca", m.ca.CAFile, "lock:x"}, []string{"--redis-tls-ca needs a rediss:// URL"}},
		{nil, append([]string{"doctor", "--redis-sentinel", plainURL + "?master_name=m"}, certKey...), []string{"--redis-tls-cert needs a rediss:// URL"}},
		{nil, append([]string{"status", "--redis-cluster", plainURL, "lock:x"}, certKey...), []string{"--redis-tls-cert needs a rediss:// URL"}},
		{nil, append([]string{"exec", "--redlock", tlsURL + "," + plainURL + "," + tlsURL, "lock:x"}, append(certKey, "--", "true")...), []string{"--redis-tls-cert needs a rediss:// URL", plainURL}},
		{nil, append([]string{"doctor", "--redlock", plainURL}, certKey...), []string{"--redis-tls-cert needs a rediss:// URL"}},
		{nil, append([]string{"exec", "--etcd", "http://" + hole, "lock:x"}, append(certKey, "--", "true")...), []string{"--redis-tls-cert is for Redis servers, not --etcd"}},
		{nil, []string{"exec", "--redis", tlsURL, "--redis-tls-cert", missing, "--redis-tls-key", m.client.KeyFile, "lock:x", "--", "true"}, []string{"--redis-tls-cert", missing, "no such file"}},
		{nil, []string{"status", "--redis", tlsURL, "--redis-tls-cert", m.client.CertFile, "--redis-tls-key", garbage, "lock:x"}, []string{"--redis-tls-key", garbage, "PEM"}},
		{nil, []string{"doctor", "--redis", tlsURL, "--redis-tls-cert", m.client.CertFile, "--redis-tls-key", other.KeyFile}, []string{other.KeyFile, "private key does not match"}},
		{nil, []string{"status", "--redis", tlsURL, "--redis-tls-ca", garbage, "lock:x"}, []string{"--redis-tls-ca", garbage, "no PEM certificate"}},
		{nil, []string{"doctor", "--redis", tlsURL, "--redis-tls-ca", missing}, []string{"--redis-tls-ca", missing, "no such file"}},
		{nil, []string{"status", "--redis", tlsURL, "--redis-tls-cert", "", "lock:x"}, []string{"--redis-tls-cert was given with no value"}},
	} {
		start := time.Now()
		out, errOut, code := fence(t, c.env, c.args...)
		took := time.Since(start)
		ok := code == cli.ExitUsage && took < 3*time.Second
		for _, w := range c.want {
			ok = ok && strings.Contains(errOut, w)
		}
		if !ok {
			t.Errorf("%v %v: exit %d after %v, stdout %q, stderr %q; want %d at once saying %q", c.env, c.args, code, took, out, errOut, cli.ExitUsage, c.want)
		}
	}
}

// TestTLSSchemeMismatch: redis:// naming a port that speaks TLS alone
// (--port 0 --tls-port): the server closes each plain connection, which
// exec retried for all of --wait and every command reported as a bare
// "EOF". Exit 2, within exec's --wait bound, saying that the port speaks
// TLS. And rediss:// naming a plain port, whose server never answers the
// handshake (Redis waits for a line end the ClientHello may not have):
// exit 2 within exec's --wait bound and status's --timeout, "no answer".
func TestTLSSchemeMismatch(t *testing.T) {
	// Not parallel: it measures bounds of seconds (see TestExecBlackHoleWithinWait).
	ca := redistest.NewTLS(t)
	tlsSrv := redistest.StartTLS(t, ca)
	plain := redistest.Start(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "--wait", "1s", "--redis", "redis://" + tlsSrv.Addr, "lock:x", "--", "true"}, tlsSrv.Addr + " speaks TLS: use rediss://"},
		{[]string{"status", "--redis", "redis://" + tlsSrv.Addr, "lock:x"}, tlsSrv.Addr + " speaks TLS: use rediss://"},
		{[]string{"doctor", "--redis", "redis://" + tlsSrv.Addr}, tlsSrv.Addr + " speaks TLS: use rediss://"},
		{[]string{"exec", "--wait", "1s", "--redis", "rediss://" + plain.Addr, "lock:x", "--", "true"}, "no answer from Redis"},
		{[]string{"status", "--timeout", "1s", "--redis", "rediss://" + plain.Addr, "lock:x"}, "deadline exceeded"},
	} {
		start := time.Now()
		out, errOut, code := fence(t, trustCA(ca.CAFile), c.args...)
		took := time.Since(start)
		t.Logf("%v: exit %d after %v: %s", c.args, code, took, errOut)
		if code != cli.ExitUsage || took > 5*time.Second || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d after %v, stdout %q, stderr %q; want %d within 5s saying %q", c.args, code, took, out, errOut, cli.ExitUsage, c.want)
		}
	}
}

// TestTLSDoctorSentinelCertificateRefused: of three TLS sentinels, one has
// a certificate from a CA the doctor's host does not trust. The finding
// said it was "unreachable", fix "restart the sentinels"; it must name the
// TLS verification failure.
func TestTLSDoctorSentinelCertificateRefused(t *testing.T) {
	t.Parallel()
	ca := redistest.NewTLS(t)
	primary := redistest.StartTLS(t, ca)
	s := redistest.StartSentinels(t, primary, 2)
	// A sentinel with another CA's certificate: StartSentinels gives the
	// sentinels the certificate of the primary it is given.
	untrusted := &redistest.Server{Server: &redisserver.Server{Addr: primary.Addr, TLS: redistest.NewTLS(t)}}
	odd := redistest.StartSentinels(t, untrusted, 1).Servers[0]
	url := "rediss://" + s.Addrs()[0] + "?master_name=" + s.Master + "&addr=" + s.Addrs()[1] + "&addr=" + odd.Addr
	out, errOut, code := fence(t, trustCA(ca.CAFile), "doctor", "--json", "--redis-sentinel", url)
	t.Logf("doctor: exit %d\n%s%s", code, out, errOut)
	var report struct {
		Findings []struct{ ID, Why, Fix string }
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("doctor --json: %v: %q", err, out)
	}
	var why string
	for _, f := range report.Findings {
		if f.ID == "sentinel-unreachable" {
			why = f.Why + " " + f.Fix
		}
	}
	if !strings.Contains(why, odd.Addr+" failed the TLS handshake") || !strings.Contains(why, "certificate") {
		t.Errorf("doctor with a sentinel whose certificate does not verify: exit %d, stdout %q, stderr %q; want a finding naming the TLS failure", code, out, errOut)
	}
}

// TestTLSRedlock: --redlock with three rediss:// masters (one of them with a
// certificate from a CA fence does not trust): exec takes the lock on the
// two that verify, status reads it, and doctor names the third's TLS
// failure.
func TestTLSRedlock(t *testing.T) {
	t.Parallel()
	ca := redistest.NewTLS(t)
	a, b := redistest.StartTLS(t, ca), redistest.StartTLS(t, ca)
	c := redistest.StartTLS(t, redistest.NewTLS(t))
	urls := "rediss://" + a.Addr + ",rediss://" + b.Addr + ",rediss://" + c.Addr
	env := trustCA(ca.CAFile)
	out, errOut, code := fence(t, env, "exec", "--redlock", urls, "lock:x", "--", "echo", "ran")
	t.Logf("exec: exit %d %q %q", code, out, errOut)
	if code != 0 || out != "ran\n" {
		t.Errorf("exec --redlock over TLS, 2 of 3 masters verifying: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = fence(t, env, "status", "--redlock", urls, "lock:x")
	t.Logf("status: exit %d %q %q", code, out, errOut)
	out, errOut, code = fence(t, env, "doctor", "--json", "--redlock", urls)
	t.Logf("doctor: exit %d %q %q", code, out, errOut)
	if !strings.Contains(out, c.Addr) || !strings.Contains(out, "TLS handshake") {
		t.Errorf("doctor --redlock with a master whose certificate does not verify: exit %d, stdout %q, stderr %q; want a finding naming its TLS failure", code, out, errOut)
	}
}

// TestTLSBlackHoleNoWait: exec --wait 0 (one try, bounded by the client's
// timeouts: the URL's dial_timeout and read_timeout, then 1.5 s) on a
// rediss:// black hole, where the TLS handshake is part of the dial:
// go-redis's 5 dial attempts per connection made it 5 dial timeouts
// (6.6 s with dial_timeout=1s, 26.6 s with the defaults), where plain TCP
// took 2.2 s.
func TestTLSBlackHoleNoWait(t *testing.T) {
	// Not parallel: it measures bounds of seconds (see TestExecBlackHoleWithinWait).
	hole := silent.Addr(t)
	for _, c := range []struct {
		url   string
		limit time.Duration
	}{
		{"redis://" + hole + "?dial_timeout=1s&read_timeout=1s", 5 * time.Second},
		{"rediss://" + hole + "?dial_timeout=1s&read_timeout=1s", 5 * time.Second},
	} {
		start := time.Now()
		out, errOut, code := fence(t, nil, "exec", "--redis", c.url, "lock:x", "--", "true")
		took := time.Since(start)
		t.Logf("exec --wait 0 %s: exit %d after %v: %s", c.url, code, took, errOut)
		if code != cli.ExitUsage || took > c.limit {
			t.Errorf("exec --wait 0 %s: exit %d after %v, want %d within %v; stdout %q, stderr %q", c.url, code, took, cli.ExitUsage, c.limit, out, errOut)
		}
	}
}

// TestTLSCluster: --redis-cluster with a rediss:// URL to a cluster whose
// nodes speak TLS alone (--port 0, --tls-cluster yes), one replica each:
// exec, status and doctor, which reads every master and replica.
func TestTLSCluster(t *testing.T) {
	t.Parallel()
	ca := redistest.NewTLS(t)
	c := redistest.StartClusterTLS(t, ca, 3, 1)
	url := "rediss://" + c.Addrs()[0]
	env := trustCA(ca.CAFile)
	out, errOut, code := fence(t, env, "exec", "--redis-cluster", url, "lock:x", "--", "echo", "ran")
	t.Logf("exec: exit %d %q %q", code, out, errOut)
	if code != 0 || out != "ran\n" {
		t.Errorf("exec --redis-cluster over TLS: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = fence(t, env, "status", "--redis-cluster", url, "lock:x")
	t.Logf("status: exit %d %q %q", code, out, errOut)
	if code != 0 || !strings.Contains(out, "free") {
		t.Errorf("status --redis-cluster over TLS: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = fence(t, env, "doctor", "--json", "--redis-cluster", url)
	t.Logf("doctor: exit %d %q %q", code, out, errOut)
	for _, s := range append(c.Servers, c.Replicas...) {
		if !strings.Contains(out, `"node":"`+s.Addr+`"`) {
			t.Errorf("doctor --redis-cluster over TLS has no finding on %s", s.Addr)
		}
	}
	if code == cli.ExitUsage || strings.Contains(out, "unreachable") || strings.Contains(out, ":0\"") {
		t.Errorf("doctor --redis-cluster over TLS: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestTLSDoctorReplicaBlackHole: the primary answers over TLS; the replica
// it lists (announced at a listener that accepts and never answers the TLS
// handshake) does not. The doctor keeps --timeout, audits the primary, and
// reports the replica unreachable.
func TestTLSDoctorReplicaBlackHole(t *testing.T) {
	// Not parallel: it measures a bound of seconds.
	ca := redistest.NewTLS(t)
	primary := redistest.StartTLS(t, ca)
	hole := silent.Addr(t)
	host, port, _ := strings.Cut(hole, ":")
	redistest.StartReplica(t, primary, "--replica-announce-ip", host, "--replica-announce-port", port)
	redistest.WaitReplicated(t, primary, 1)
	start := time.Now()
	out, errOut, code := fence(t, trustCA(ca.CAFile), "doctor", "--timeout", "3s", "--redis", "rediss://"+primary.Addr)
	took := time.Since(start)
	t.Logf("doctor: exit %d after %v\n%s%s", code, took, out, errOut)
	if took > 7*time.Second || !strings.Contains(out, "node-unreachable  "+hole) || !strings.Contains(out, "persistence-off   "+primary.Addr) {
		t.Errorf("doctor --timeout 3s with a TLS replica that never answers: exit %d after %v, stdout %q, stderr %q", code, took, out, errOut)
	}
}
