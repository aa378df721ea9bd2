package tlsanswer_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/tlsanswer"
	"github.com/fencekit/fence/internal/redistest"
)

// TestExplainReset: a TLS 1.3 server that refuses the client's certificate
// may reach the client as a reset of its first command (a CI run's doctor
// said "deployment unreachable: …: INFO: write: connection reset by peer"
// of a node that refused a certificate of another CA). Explain asks the
// node again with a handshake alone and returns its alert; a node that
// accepts the handshake leaves the error as it was, and so does an error
// that Explain has already explained (no second probe, no second note).
func TestExplainReset(t *testing.T) {
	ca := redistest.NewTLS(t)
	asking := redistest.StartTLS(t, ca, "--tls-auth-clients", "yes")
	open := redistest.StartTLS(t, ca, "--tls-auth-clients", "no")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reset := fmt.Errorf("write tcp: %w", syscall.ECONNRESET)
	cfg := &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}

	err := tlsanswer.Explain(ctx, asking.Addr, cfg, reset)
	if tlsanswer.Refusal(err) == nil || !strings.Contains(err.Error(), "certificate required") || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a reset from a node that asks for a client certificate, none given: %v; want its alert, and the reset", err)
	}
	if again := tlsanswer.Explain(ctx, asking.Addr, cfg, err); again != err {
		t.Fatalf("an explained reset explained again: %v, want it unchanged", again)
	}
	if err := tlsanswer.Explain(ctx, open.Addr, cfg, reset); err != reset {
		t.Fatalf("a reset from a node that accepts the handshake: %v, want it unchanged", err)
	}
	if err := tlsanswer.Explain(ctx, asking.Addr, nil, reset); err != reset {
		t.Fatalf("a reset from a node reached without TLS: %v, want it unchanged", err)
	}
}
