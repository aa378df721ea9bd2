package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/tlsanswer"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/spf13/cobra"
)

// TestTLSHintExplainsReset: a server that refuses the client's certificate
// can reach exec and status as a reset of their first command (TLS 1.3:
// the client's handshake ends before the server checks the certificate);
// 1 run in 40 printed "write: connection reset by peer" and no word of a
// certificate. tlsHint asks the server again and names its alert. A
// redis:// URL to a TLS port still gets its "use rediss://" hint, and a
// Sentinel deployment the error as it was.
func TestTLSHintExplainsReset(t *testing.T) {
	ca := redistest.NewTLS(t)
	srv := redistest.StartTLS(t, ca, "--tls-auth-clients", "yes")
	// As exec and status do: the flags, the client from them, then the
	// hint for the client's error.
	hint := func(args []string, err error) error {
		t.Helper()
		var rf redisFlags
		cmd := &cobra.Command{Use: "status"}
		rf.register(cmd)
		if perr := cmd.Flags().Parse(args); perr != nil {
			t.Fatal(perr)
		}
		ct, cerr := redisTLS(cmd)
		if cerr != nil {
			t.Fatal(cerr)
		}
		c, cerr := rf.client(ct)
		if cerr != nil {
			t.Fatal(cerr)
		}
		_ = c.Close()
		return rf.tlsHint(t.Context(), err)
	}
	reset := fmt.Errorf("redislock: status \"lock:x\": write tcp: %w", syscall.ECONNRESET)

	err := hint([]string{"--redis", "rediss://" + srv.Addr, "--redis-tls-ca", ca.CAFile}, reset)
	if tlsanswer.Refusal(err) == nil || !strings.Contains(err.Error(), "certificate required") || !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a reset over rediss:// from a server that wants a client certificate, none given: %v; want its alert, and the reset", err)
	}
	// The CA from a pipe, as the help suggests (<(vault read …)): the
	// hint uses what the client was made with, not the file read again
	// (a pipe is empty then, and the hint was lost).
	pr, pw, perr := os.Pipe()
	if perr != nil {
		t.Fatal(perr)
	}
	t.Cleanup(func() { _ = pr.Close() })
	go func() {
		pem, _ := os.ReadFile(ca.CAFile)
		_, _ = pw.Write(pem)
		_ = pw.Close()
	}()
	piped := fmt.Sprintf("/proc/self/fd/%d", pr.Fd())
	err = hint([]string{"--redis", "rediss://" + srv.Addr, "--redis-tls-ca", piped}, reset)
	if !strings.Contains(fmt.Sprint(err), "certificate required") {
		t.Errorf("a reset over rediss://, the CA given by a pipe: %v; want the server's alert", err)
	}
	if err := hint([]string{"--redis", "redis://" + srv.Addr}, io.EOF); !strings.Contains(fmt.Sprint(err), "speaks TLS: use rediss://") {
		t.Errorf("EOF over redis:// from a TLS port: %v; want the rediss:// hint", err)
	}
	sentinel := []string{"--redis-sentinel", "rediss://" + srv.Addr + "?master_name=m", "--redis-tls-ca", ca.CAFile}
	if err := hint(sentinel, reset); err != reset {
		t.Errorf("a reset from a Sentinel deployment: %v, want it unchanged", err)
	}
}
