package cli_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/cli"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/silent"
)

// TestTLSFlagFilesHostile: the TLS flags' files as a careless user names
// them. A file with no end (/dev/zero) or a huge one was read whole by
// os.ReadFile: fence never started, its memory growing without bound (a
// 16 MiB sparse file was read in full and reported as "no PEM
// certificate"). Now each is exit 2 at once, naming the flag and saying the
// file is too large. A key that is a directory and a symlink loop are exit 2
// naming the flag (held). A certificate and key given the wrong way round
// are refused without printing what the files hold (held). A FIFO that
// nobody writes to blocked fence in open(2) for good (killed after 20 s);
// now it reads as empty: exit 2, no PEM certificate.
func TestTLSFlagFilesHostile(t *testing.T) {
	t.Parallel()
	m := newMTLS(t)
	dir := t.TempDir()
	huge := filepath.Join(dir, "huge.pem")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(16 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	loop := filepath.Join(dir, "loop.pem")
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.pem")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	tlsURL := "rediss://" + silent.Addr(t)
	certKey := []string{"--redis-tls-cert", m.client.CertFile, "--redis-tls-key", m.client.KeyFile}
	keyPEM, err := os.ReadFile(m.client.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := os.ReadFile(m.client.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"huge-ca", []string{"status", "--redis", tlsURL, "--redis-tls-ca", huge, "lock:x"}, []string{"--redis-tls-ca", huge, "larger than"}},
		{"devzero-ca", []string{"status", "--redis", tlsURL, "--redis-tls-ca", "/dev/zero", "lock:x"}, []string{"--redis-tls-ca", "/dev/zero", "larger than"}},
		{"devzero-cert", []string{"exec", "--redis", tlsURL, "--redis-tls-cert", "/dev/zero", "--redis-tls-key", m.client.KeyFile, "lock:x", "--", "true"}, []string{"--redis-tls-cert", "/dev/zero", "larger than"}},
		{"fifo-ca", []string{"status", "--redis", tlsURL, "--redis-tls-ca", fifo, "lock:x"}, []string{"--redis-tls-ca", fifo, "no PEM certificate"}},
		{"dir-key", []string{"doctor", "--redis", tlsURL, "--redis-tls-cert", m.client.CertFile, "--redis-tls-key", dir}, []string{"--redis-tls-key", dir, "is a directory"}},
		{"loop-ca", append([]string{"status", "--redis", tlsURL, "--redis-tls-ca", loop, "lock:x"}, certKey...), []string{"--redis-tls-ca", loop, "too many levels of symbolic links"}},
		{"switched", []string{"status", "--redis", tlsURL, "--redis-tls-cert", m.client.KeyFile, "--redis-tls-key", m.client.CertFile, "lock:x"}, []string{"--redis-tls-cert", m.client.KeyFile}},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			out, errOut, code := fenceWithin(t, 20*time.Second, nil, c.args...)
			took := time.Since(start)
			ok := code == cli.ExitUsage && took < 5*time.Second
			for _, w := range c.want {
				ok = ok && strings.Contains(errOut, w)
			}
			if !ok {
				t.Errorf("%v: exit %d after %v, stdout %q, stderr %q; want %d at once saying %q", c.args, code, took, out, errOut, cli.ExitUsage, c.want)
			}
			for _, secret := range []string{string(keyPEM[40:80]), string(certPEM[40:80]), "PRIVATE KEY-----"} {
				if strings.Contains(out+errOut, secret) {
					t.Errorf("%v: output holds the files' PEM: %q", c.args, out+errOut)
				}
			}
		})
	}
}

// TestTLSFlagFilesOdd: files that are odd but usable (held): a CA file with
// junk around the one certificate that matters, a certificate and key given
// through pipes (process substitution, /dev/fd/N), and client certificates
// with RSA and Ed25519 keys, each accepted by a Redis run with
// tls-auth-clients yes.
func TestTLSFlagFilesOdd(t *testing.T) {
	t.Parallel()
	m := newMTLS(t)
	dir := t.TempDir()
	// A second CA, of Ed25519, issuing an RSA and an Ed25519 client
	// certificate; the server trusts both CAs for clients.
	caPub, caKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "odd CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caPub, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	mainCA, err := os.ReadFile(m.ca.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle.pem")
	write(t, bundle, append(append([]byte{}, mainCA...), caPEM...))
	srv := redistest.StartTLS(t, m.ca, append(authClients, "--tls-ca-cert-file", bundle)...)
	refusesWithoutCert(t, m, srv.Addr)
	url := "rediss://" + srv.Addr

	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for name, key := range map[string]crypto.Signer{"rsa": rsaKey, "ed25519": edKey} {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		write(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
		write(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
		out, errOut, code := fence(t, nil, "status", "--redis", url, "--redis-tls-cert", certFile, "--redis-tls-key", keyFile, "--redis-tls-ca", m.ca.CAFile, "lock:x")
		if code != 0 || !strings.Contains(out, "free") {
			t.Errorf("status with an %s client certificate: exit %d, stdout %q, stderr %q", name, code, out, errOut)
		}
	}

	junk := filepath.Join(dir, "junk.pem")
	write(t, junk, slicesConcat([]byte("junk before\n-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"),
		mainCA, []byte("\n-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\ntrailing junk\n")))
	out, errOut, code := fence(t, nil, "status", "--redis", url, "--redis-tls-cert", m.client.CertFile, "--redis-tls-key", m.client.KeyFile, "--redis-tls-ca", junk, "lock:x")
	if code != 0 || !strings.Contains(out, "free") {
		t.Errorf("status with a CA file of junk and one certificate: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	certPEM, err := os.ReadFile(m.client.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code = fenceWithin(t, 2*time.Minute, certPEM, "status", "--redis", url, "--redis-tls-cert", "/dev/stdin", "--redis-tls-key", m.client.KeyFile,
		"--redis-tls-ca", m.ca.CAFile, "lock:x")
	if code != 0 || !strings.Contains(out, "free") {
		t.Errorf("status with the certificate from a pipe (/dev/stdin): exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// fenceWithin is fence with stdin (nil: none) and a deadline d, after
// which the process is killed.
func fenceWithin(t *testing.T, d time.Duration, stdin []byte, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, fenceBin, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("fence %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

func write(t *testing.T, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(name, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func slicesConcat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}
