package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// tlsProbeTimeout bounds plainToTLS's handshake: a hint, not worth
// stretching the commands' bounds for.
const tlsProbeTimeout = 500 * time.Millisecond

// plainToTLS adds a hint to err, an error of a command on the standalone
// Redis that the redis:// URL url names, when the server closed the
// connection (EOF, reset) and its port answers a TLS handshake: a
// redis-server that speaks TLS alone (--port 0 --tls-port) closes a plain
// client's connection, which fence said as a bare "EOF", retried for all
// of --wait. The probe checks no certificate: it only tells TLS from not.
func plainToTLS(err error, url string) error {
	if err == nil || !(errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)) {
		return err
	}
	o, perr := redis.ParseURL(url)
	if perr != nil || o.TLSConfig != nil || o.Network != "tcp" {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), tlsProbeTimeout)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}
	c, derr := d.DialContext(ctx, "tcp", o.Addr)
	if derr != nil {
		return err
	}
	_ = c.Close()
	return fmt.Errorf("%w (%s speaks TLS: use rediss://)", err, o.Addr)
}

// tlsHintTarget is the --redis URL that plainToTLS probes, or "" when the
// lock service is not a standalone Redis named by --redis.
func (f *redisFlags) tlsHintTarget() string {
	if f.sentinelURL != "" || f.clusterURL != "" {
		return ""
	}
	return f.url
}
