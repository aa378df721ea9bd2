package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/tlsanswer"
)

// tlsProbeTimeout bounds tlsHint's probes: a hint, not worth stretching
// the commands' bounds for.
const tlsProbeTimeout = 500 * time.Millisecond

// plainToTLS adds a hint to err, an error of a command on the standalone
// Redis at addr, named by a redis:// URL, when the server closed the
// connection (EOF, reset) and its port answers a TLS handshake: a
// redis-server that speaks TLS alone (--port 0 --tls-port) closes a plain
// client's connection, which fence said as a bare "EOF", retried for all
// of --wait. The probe checks no certificate: it only tells TLS from not.
func plainToTLS(ctx context.Context, err error, addr string) error {
	if !(errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)) {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, tlsProbeTimeout)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}
	c, derr := d.DialContext(ctx, "tcp", addr)
	if derr != nil {
		return err
	}
	_ = c.Close()
	return fmt.Errorf("%w (%s speaks TLS: use rediss://)", err, addr)
}

// tlsHint adds to err, an error of a command on the standalone Redis that
// --redis names, what that server's port says of it: over redis://, that
// it speaks TLS (plainToTLS); over rediss://, the alert of a server that
// refused the client's certificate, where err is only the reset or EOF
// that TLS 1.3 can leave of it (tlsanswer.Explain; a refusal read as
// "connection reset by peer" sent the user looking for a network fault).
// It probes with the options the command's client was made with, within
// ctx and tlsProbeTimeout. Sentinel and Cluster deployments get err as it
// is.
func (f *redisFlags) tlsHint(ctx context.Context, err error) error {
	o := f.standalone
	if err == nil || o == nil || o.Network != "tcp" {
		return err
	}
	if o.TLSConfig == nil {
		return plainToTLS(ctx, err, o.Addr)
	}
	ctx, cancel := context.WithTimeout(ctx, tlsProbeTimeout)
	defer cancel()
	return tlsanswer.Explain(ctx, o.Addr, o.TLSConfig, err)
}
