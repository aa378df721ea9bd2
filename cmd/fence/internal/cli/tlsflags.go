package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// The TLS flags of every command that takes a Redis URL (--redis,
// --redis-sentinel, --redis-cluster, --redlock), with their environment
// variables. go-redis's URL parser refuses parameters it does not know, so
// a client certificate cannot come in the URL as it does for redis-cli
// (--cert, --key, --cacert).
var tlsFileFlags = []struct{ name, env, usage string }{
	{"redis-tls-cert", "FENCE_REDIS_TLS_CERT",
		"PEM file of the client certificate to present to Redis servers that ask for one (tls-auth-clients yes); needs --redis-tls-key and rediss:// URLs (default from FENCE_REDIS_TLS_CERT)"},
	{"redis-tls-key", "FENCE_REDIS_TLS_KEY",
		"PEM file of --redis-tls-cert's private key (default from FENCE_REDIS_TLS_KEY)"},
	{"redis-tls-ca", "FENCE_REDIS_TLS_CA",
		"PEM file of the CA certificates that Redis servers' certificates are checked against, in place of the system's (SSL_CERT_FILE); needs rediss:// URLs (default from FENCE_REDIS_TLS_CA)"},
}

// registerTLSFlags adds the TLS flags to cmd, their defaults from the
// environment.
func registerTLSFlags(cmd *cobra.Command) {
	for _, f := range tlsFileFlags {
		cmd.Flags().String(f.name, os.Getenv(f.env), f.usage)
	}
}

// clientTLS is what the TLS flags' files hold, read before any connection
// and put into each rediss:// URL's TLS config by apply.
type clientTLS struct {
	certs []tls.Certificate
	roots *x509.CertPool // nil: the system's (or SSL_CERT_FILE's)
	given string         // the first TLS flag given, as errors name it
}

// redisTLS reads the files that cmd's TLS flags (or their variables) name:
// nil when none is given. A certificate without its key (or the reverse),
// a file that cannot be read, or one that holds no usable PEM is an error
// naming the flag, the file and why.
func redisTLS(cmd *cobra.Command) (*clientTLS, error) {
	var vals [3]string
	var names [3]string
	for i, f := range tlsFileFlags {
		names[i] = "--" + f.name
		fl := cmd.Flags().Lookup(f.name)
		if fl == nil {
			continue
		}
		vals[i] = fl.Value.String()
		if !fl.Changed && vals[i] != "" {
			names[i] = "--" + f.name + " (from " + f.env + ")"
		}
		if fl.Changed && vals[i] == "" {
			return nil, fmt.Errorf("--%s was given with no value: name a PEM file, or leave the flag out", f.name)
		}
	}
	certFile, keyFile, caFile := vals[0], vals[1], vals[2]
	if certFile == "" && keyFile == "" && caFile == "" {
		return nil, nil
	}
	ct := &clientTLS{}
	switch {
	case certFile != "" && keyFile == "":
		return nil, fmt.Errorf("%s needs --redis-tls-key, the certificate's private key", names[0])
	case keyFile != "" && certFile == "":
		return nil, fmt.Errorf("%s needs --redis-tls-cert, the certificate the key belongs to", names[1])
	case certFile != "":
		ct.given = names[0]
		certPEM, err := readPEMFile(certFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", names[0], err)
		}
		keyPEM, err := readPEMFile(keyFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", names[1], err)
		}
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("%s %s and %s %s: %w", names[0], certFile, names[1], keyFile, err)
		}
		ct.certs = []tls.Certificate{c}
	}
	if caFile != "" {
		if ct.given == "" {
			ct.given = names[2]
		}
		pem, err := readPEMFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", names[2], err)
		}
		ct.roots = x509.NewCertPool()
		if !ct.roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in the file", names[2], caFile)
		}
	}
	return ct, nil
}

// maxPEMFile bounds what readPEMFile reads: a CA bundle of every public
// root is about 200 KiB.
const maxPEMFile = 4 << 20

// readPEMFile is os.ReadFile bounded by maxPEMFile: a file past it (a
// mistyped path such as /dev/zero or /dev/urandom, a disk image) is an
// error after reading maxPEMFile+1 bytes, not a read that never ends or
// fills memory, and a FIFO with no writer reads as empty rather than
// block in open (pemOpenFlags). Pipes (--redis-tls-cert <(vault read ...))
// still work.
func readPEMFile(name string) ([]byte, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|pemOpenFlags, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPEMFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxPEMFile {
		return nil, fmt.Errorf("%s: larger than %d MiB, not a PEM file", name, maxPEMFile>>20)
	}
	return b, nil
}

// errTLSNeedsRediss is the error of TLS flags given with a redis:// URL.
var errTLSNeedsRediss = errors.New("needs a rediss:// URL")

// apply puts the client certificate and the CAs into conf, the TLS config
// of the URL given to flag (nil for a redis:// URL, which is then an
// error: the flags would be silently ignored). A nil ct changes nothing.
func (ct *clientTLS) apply(flag, raw string, conf *tls.Config) error {
	if ct == nil {
		return nil
	}
	if conf == nil {
		return fmt.Errorf("%s %w: %s %s is not one", ct.given, errTLSNeedsRediss, flag, redactURL(raw))
	}
	if ct.certs != nil {
		conf.Certificates = ct.certs
	}
	if ct.roots != nil {
		conf.RootCAs = ct.roots
	}
	return nil
}

// tlsFlagsWithout refuses TLS flags given on the command line to a command
// whose lock service is not Redis (--etcd, --zookeeper): they would be
// silently ignored.
func tlsFlagsWithout(cmd *cobra.Command, service string) error {
	for _, f := range tlsFileFlags {
		if cmd.Flags().Changed(f.name) {
			return fmt.Errorf("--%s is for Redis servers, not %s", f.name, service)
		}
	}
	return nil
}
