package tlsanswer_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/tlsanswer"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// resettingTLS is a TLS endpoint that completes every handshake (the
// client's certificate is not asked for) and resets the connection as
// soon as the client writes anything: a TLS-terminating proxy whose
// upstream is gone, or a node whose connections are killed.
func resettingTLS(t *testing.T) string {
	ca := redistest.NewTLS(t)
	cert, err := tls.LoadX509KeyPair(ca.CertFile, ca.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = c.(*tls.Conn).Handshake()
				_, _ = c.Read(make([]byte, 1))
				_ = c.(*tls.Conn).NetConn().(*net.TCPConn).SetLinger(0)
				_ = c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

// TestExplainSilentNodeCost: a node that accepts the handshake and then
// resets the first command is not refusing a certificate; Explain sat on a
// read for 2 s (waiting for an alert that never comes) before returning
// the reset as it was. Every such node cost a doctor run 2 s, one after
// another for a cluster's masters (the doctor reads them in turn).
func TestExplainSilentNodeCost(t *testing.T) {
	addr := resettingTLS(t)
	cfg := &tls.Config{InsecureSkipVerify: true}
	c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: cfg, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := c.Ping(ctx).Err()
	t.Logf("PING: %v (EOF: %v)", err, err == io.EOF)
	start := time.Now()
	got := tlsanswer.Explain(ctx, addr, cfg, err)
	took := time.Since(start)
	t.Logf("Explain: %v after %v", got, took)
	if took > 500*time.Millisecond {
		t.Fatalf("Explain took %v on a node that accepted the handshake (no alert to wait for)", took)
	}
}
