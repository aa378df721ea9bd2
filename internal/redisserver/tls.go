package redisserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TLS is a private certificate authority and one certificate it signed for
// 127.0.0.1 and localhost, written as PEM files for redis-server. The
// certificate serves both ends (server and client auth), as redis-server
// uses its own certificate for its outgoing links (replication, sentinels).
type TLS struct {
	CAFile   string // the CA's certificate
	CertFile string // the server's certificate
	KeyFile  string // the server's key

	// Pool holds the CA certificate: the roots a client trusts.
	Pool *x509.CertPool
	cert tls.Certificate

	name  string // the certificate's first name, which ClientConfig verifies
	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
	dir   string
}

// NewTLS makes a CA (ECDSA P-256) and a certificate for 127.0.0.1 and
// localhost, valid for a day, and writes them to dir.
func NewTLS(dir string) (*TLS, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "fence test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("tls: CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		return nil, err
	}
	parent := &TLS{CAFile: filepath.Join(dir, "ca.crt"), Pool: x509.NewCertPool(), ca: ca, caKey: caKey}
	parent.Pool.AddCert(ca)
	return parent.Issue(dir, "127.0.0.1", "localhost")
}

// Issue returns a TLS with the same CA and a new certificate for names (IP
// addresses or DNS names), its files written to dir: a server whose
// certificate names only some of the ways it is reached.
func (t *TLS) Issue(dir string, names ...string) (*TLS, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, t.ca, &key.PublicKey, t.caKey)
	if err != nil {
		return nil, fmt.Errorf("tls: certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if dir == t.dir {
		return nil, fmt.Errorf("tls: %s holds another certificate already", dir)
	}
	c := &TLS{
		CAFile:   t.CAFile,
		CertFile: filepath.Join(dir, "redis.crt"),
		KeyFile:  filepath.Join(dir, "redis.key"),
		Pool:     t.Pool, name: names[0], ca: t.ca, caKey: t.caKey, dir: dir,
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	if err := os.WriteFile(c.CertFile, certPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(c.KeyFile, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if c.cert, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return nil, err
	}
	return c, nil
}

// ClientConfig returns a *tls.Config that trusts the CA, verifies the
// server's certificate against its first name (127.0.0.1 for NewTLS's),
// whatever address is dialled, and presents the certificate, for servers
// run with --tls-auth-clients yes. Each call returns a new one.
func (t *TLS) ClientConfig() *tls.Config {
	return &tls.Config{RootCAs: t.Pool, ServerName: t.name, Certificates: []tls.Certificate{t.cert}, MinVersion: tls.VersionTLS12}
}

// args are redis-server's arguments to serve TLS alone on port, with TLS on
// its own links to a primary too, clients not asked for certificates.
func (t *TLS) args(port string) []string {
	return []string{
		"--port", "0", "--tls-port", port,
		"--tls-cert-file", t.CertFile, "--tls-key-file", t.KeyFile, "--tls-ca-cert-file", t.CAFile,
		"--tls-auth-clients", "no", "--tls-replication", "yes",
	}
}

// StartTLS is Start for a server that listens for TLS alone (--port 0,
// --tls-port), with t's certificate; extra arguments come last, so
// "--tls-auth-clients", "yes" asks clients for certificates. Its Client
// speaks TLS, and StartReplica and StartSentinels given it start servers
// that speak TLS too, also to it. A redis-server built without TLS fails
// to start, with its log in the error.
func StartTLS(dir string, t *TLS, extra ...string) (*Server, error) {
	return start(dir, t, extra)
}
