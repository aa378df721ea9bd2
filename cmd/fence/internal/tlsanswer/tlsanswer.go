// Package tlsanswer tells why a Redis server over TLS ended a connection,
// for fence's commands and its doctor: a server that refuses the client's
// certificate says so in a TLS alert, which a client may never read.
package tlsanswer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// probeLimit bounds Explain's handshake and read, whatever ctx allows.
const probeLimit = 2 * time.Second

// Explain explains err, a connection to the TLS server at addr reset or
// ended, by the server's answer to a handshake alone, made with cfg (the
// client's TLS config). With TLS 1.3 the client's handshake ends before
// the server has checked the client's certificate: a server that refuses
// it sends its alert and closes, and the client's first command, written
// meanwhile, may meet a reset instead of the alert (the refusal then read
// as "connection reset by peer", unexplained). A handshake followed by a
// read, nothing written, gets the alert, which Explain returns wrapping
// err too. err is returned as it is when it is no reset, broken pipe or
// EOF, or already says the server's answer (Refusal), when cfg is nil, when the server asks for no client certificate
// (none can have been refused), and when no alert comes within 2 s or ctx.
func Explain(ctx context.Context, addr string, cfg *tls.Config, err error) error {
	if cfg == nil || Refusal(err) != nil || !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, io.EOF) {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, probeLimit)
	defer cancel()
	cfg = cfg.Clone()
	var asked atomic.Bool // the server asked for a client certificate
	own := cfg.GetClientCertificate
	cfg.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		asked.Store(true)
		if own != nil {
			return own(cri)
		}
		for i := range cfg.Certificates {
			if cri.SupportsCertificate(&cfg.Certificates[i]) == nil {
				return &cfg.Certificates[i], nil
			}
		}
		return &tls.Certificate{}, nil
	}
	conn, perr := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", addr)
	if perr == nil && !asked.Load() {
		_ = conn.Close()
		return err // no certificate asked for: none can have been refused
	}
	if perr == nil {
		defer conn.Close()
		dl, _ := ctx.Deadline()
		_ = conn.SetReadDeadline(dl)
		_, perr = conn.Read(make([]byte, 1))
	}
	if Refusal(perr) == nil {
		return err
	}
	return fmt.Errorf("%w (a connection was reset after the handshake: %w)", perr, err)
}

// Refusal returns the part of err that says a TLS handshake failed on the
// server's answer (a certificate that does not verify, a TLS alert the
// server sent), or nil.
func Refusal(err error) error {
	var cv *tls.CertificateVerificationError
	var op *net.OpError
	var hn x509.HostnameError
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	switch {
	case errors.As(err, &cv):
		return cv
	case errors.As(err, &hn):
		return hn
	case errors.As(err, &ua):
		return ua
	case errors.As(err, &ci):
		return ci
	case errors.As(err, &op) && op.Op == "remote error":
		return op
	}
	return nil
}
