package cli_test

import (
	"strings"
	"testing"

	"github.com/fencekit/fence/internal/etcdtest"
	"github.com/fencekit/fence/internal/redistest"
)

// TestTLSEnvNotPassedToChild proves what exec's help says of the TLS
// variables (held): FENCE_REDIS_TLS_CERT, _KEY and _CA are used by fence
// (the server asks for a client certificate) and not passed to the
// command. And with --etcd, FENCE_REDIS_TLS_CA naming a file that does not
// exist (a shell profile's export) is neither an error nor passed on:
// the variables are defaults of the Redis flags only.
func TestTLSEnvNotPassedToChild(t *testing.T) {
	t.Parallel()
	m := newMTLS(t)
	srv := redistest.StartTLS(t, m.ca, authClients...)
	refusesWithoutCert(t, m, srv.Addr)
	env := []string{"FENCE_REDIS_URL=rediss://" + srv.Addr, "FENCE_REDIS_TLS_CERT=" + m.client.CertFile,
		"FENCE_REDIS_TLS_KEY=" + m.client.KeyFile, "FENCE_REDIS_TLS_CA=" + m.ca.CAFile}
	out, errOut, code := fence(t, env, "exec", "lock:x", "--", "sh", "-c", `env | grep -c '^FENCE_REDIS' ; echo "token:$FENCE_TOKEN"`)
	if code != 0 || !strings.HasPrefix(out, "0\ntoken:") || len(out) <= len("0\ntoken:\n") {
		t.Errorf("exec with FENCE_REDIS_TLS_*: exit %d, stdout %q (want 0 FENCE_REDIS variables and a token), stderr %q", code, out, errOut)
	}
	c := etcdtest.Start(t)
	out, errOut, code = fence(t, []string{"FENCE_REDIS_TLS_CA=/nonexistent/ca.pem", "FENCE_REDIS_TLS_CERT=/nonexistent/c.pem"},
		"exec", "--etcd", c.Members[0].ClientURL, "lock:x", "--", "sh", "-c", `env | grep -c '^FENCE_REDIS'; true`)
	if code != 0 || out != "0\n" {
		t.Errorf("exec --etcd with FENCE_REDIS_TLS_* naming missing files: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}
