package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/cmd/fence/internal/termtext"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

// redlockVar is the environment variable that gives --redlock's default.
const redlockVar = "FENCE_REDLOCK_URLS"

// redlockBackend takes the lock with Redlock, on a majority of independent
// Redis masters given as a comma-separated list of URLs.
type redlockBackend struct {
	urls string
}

func (b *redlockBackend) register(cmd *cobra.Command) {
	v := os.Getenv(redlockVar)
	cmd.Flags().StringVar(&b.urls, "redlock", v,
		"comma-separated URLs of independent Redis masters (3 or 5, not replicas of one another) to take the lock on with Redlock instead: "+
			"redis://a:6379,redis://b:6379,redis://c:6379; a majority must grant it within its validity time "+
			"(default from "+redlockVar+"; passwords are shown masked)")
	cmd.Flags().Lookup("redlock").DefValue = redactURLs(v)
}

func (b *redlockBackend) flag() string { return "redlock" }

func (b *redlockBackend) chosen() bool { return b.urls != "" }

func (b *redlockBackend) locker(cmd *cobra.Command) (fence.Locker, func(), error) {
	return b.open(cmd)
}

// redlockCloseTimeout bounds the wait, before fence exits, for the Locker's
// background work: Release returns once a majority deleted the lock, and
// the other nodes' deletes would die with the process, leaving those nodes
// locked for the lease time. A delete answers within the node timeout (at
// most 1 s by default); 3 s is also go-redis's default read timeout, within
// which a request to a hung node ends.
const redlockCloseTimeout = 3 * time.Second

// open builds one client per URL and the Locker over them; the returned
// func closes the Locker (waiting for its background work, at most
// redlockCloseTimeout, whatever the command's context: it runs after a
// signal too, and warns on stderr of what it could not finish), then the
// clients.
func (b *redlockBackend) open(cmd *cobra.Command) (*redlock.Locker, func(), error) {
	var clients []redis.UniversalClient
	closeAll := func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}
	ct, err := redisTLS(cmd)
	if err != nil {
		return nil, nil, exitWith(ExitUsage, err)
	}
	for _, raw := range splitURLs(b.urls) {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			closeAll()
			return nil, nil, exitWith(ExitUsage, fmt.Errorf("--redlock %s: an empty URL in the list", redactURLs(b.urls)))
		}
		o, err := parseURL("--redlock", raw, ct)
		if err != nil {
			closeAll()
			return nil, nil, exitWith(ExitUsage, err)
		}
		clients = append(clients, redis.NewClient(o))
	}
	watchdog := redlock.DefaultWatchdogTTL
	if f := cmd.Flags().Lookup("watchdog-ttl"); f != nil {
		watchdog, _ = cmd.Flags().GetDuration("watchdog-ttl")
	}
	l, err := redlock.New(clients, &redlock.Options{WatchdogTTL: watchdog})
	if err != nil {
		closeAll()
		return nil, nil, exitWith(ExitUsage, err)
	}
	stderr := cmd.ErrOrStderr()
	closeLocker := func() {
		ctx, cancel := context.WithTimeout(context.Background(), redlockCloseTimeout)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			fmt.Fprintf(stderr, "fence: %s (a node not reached keeps the lock until its lease time runs out; a majority is free)\n",
				scrub(err.Error(), []string{"--redlock", b.urls}))
		}
		closeAll()
	}
	return l, closeLocker, nil
}

// redactURLs is redactURL over a comma-separated list.
func redactURLs(s string) string {
	parts := splitURLs(s)
	for i, p := range parts {
		parts[i] = redactURL(p)
	}
	return strings.Join(parts, ",")
}

// redlockStatus prints the lock's state on each node.
func redlockStatus(cmd *cobra.Command, b *redlockBackend, name string, asJSON bool) error {
	l, closeClients, err := b.open(cmd)
	if err != nil {
		return err
	}
	defer closeClients()
	nodes, err := l.Status(cmd.Context(), name)
	if err != nil {
		return exitWith(ExitUsage, err)
	}
	out := cmd.OutOrStdout()
	held, reached, read := 0, 0, 0
	type jsonNode struct {
		Addr      string `json:"addr"`
		Held      bool   `json:"held"`
		TTLms     int64  `json:"ttl_ms"`
		LastToken int64  `json:"last_token"`
		Reached   bool   `json:"reached"` // it answered, if only with an error
		Read      bool   `json:"read"`    // its state was read
		Error     string `json:"error,omitempty"`
	}
	var js []jsonNode
	var lines []string
	for i, n := range nodes {
		j := jsonNode{Addr: n.Addr, Held: n.Held, TTLms: ttlMs(n.Held, n.TTL), LastToken: int64(n.LastToken)}
		state := "free"
		switch {
		case n.Err != nil:
			j.Error = scrub(n.Err.Error(), []string{"--redlock", b.urls})
			state = nodeErrState(n.Err) + termtext.Escape(j.Error) // the node's text
		case n.Held && n.TTL < 0:
			state = "held, without expiry"
		case n.Held:
			state = fmt.Sprintf("held, %v left", n.TTL.Round(1e6))
		}
		if j.Read = n.Err == nil; j.Read {
			read++
		}
		if j.Reached = n.Err == nil || !noAnswer(n.Err); j.Reached {
			reached++
		}
		if n.Held {
			held++
		}
		js = append(js, j)
		lines = append(lines, fmt.Sprintf("  node %d %s: %s; last token %d", i, n.Addr, state, n.LastToken))
	}
	// Whether a quorum holds the lock is unknown when the nodes not read
	// could make one with the holders read.
	undecided := held < l.Quorum() && held+len(nodes)-read >= l.Quorum()
	if asJSON {
		if err := encodeJSON(out, map[string]any{"name": name, "quorum": l.Quorum(), "held_on": held, "reached": reached, "read": read, "nodes": js}); err != nil {
			return err
		}
	} else {
		summary := "free"
		switch {
		case held >= l.Quorum():
			summary = "held"
		case undecided:
			summary = "held or free"
		}
		fmt.Fprintf(out, "%s: %s on %d of %d nodes (quorum %d), %d reached, %d read\n%s\n", name, summary, held, len(nodes), l.Quorum(), reached, read, strings.Join(lines, "\n"))
	}
	// With --json too: a script reading held_on below the quorum would
	// call the lock free when the nodes not read may hold it. A node that
	// answered an error was reached, but may hold the lock all the same.
	if read < l.Quorum() {
		return exitWith(ExitUsage, errors.New("fewer nodes read than a quorum"))
	}
	// Enough read, but those not read may make a quorum with the holders
	// read: 2 of 3 read held, 2 more unread, of quorum 3, said "free"
	// (TestStatusRedlockUndecidedWithQuorumRead).
	if undecided {
		return exitWith(ExitUsage, fmt.Errorf("held on %d nodes read, and the %d not read may hold it too: whether a quorum holds it is unknown", held, len(nodes)-read))
	}
	return nil
}

// nodeErrState labels a node that could not be read by what happened, so
// that an operator looks where the trouble is: only a node that gave no
// answer is unreachable (the network, or the server down); one that
// answered an error (a replica's READONLY, an ACL's NOPERM, WRONGPASS, a
// script error) was reached, and needs its configuration or the URL fixed.
func nodeErrState(err error) string {
	switch {
	case noAnswer(err):
		return "unreachable: "
	case redis.HasErrorPrefix(err, "READONLY"):
		return "answered an error, the address is a replica, not a primary: "
	case isReply(err):
		return "answered an error: "
	case isTLS(err):
		return "answered, but the TLS handshake failed: "
	}
	return "answered, not read: " // a reply that is not a lock's state
}

// noAnswer reports whether err is a request that got no answer: a dial
// refused or timed out, a connection broken or closed, a read timeout, the
// command's deadline. A TLS alert the node sent is an answer, though
// crypto/tls returns it as a *net.OpError (see isTLS).
func noAnswer(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && !isTLS(err) || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed)
}

// isTLS reports whether err is a TLS handshake that failed after the node
// answered: its certificate not trusted or not for its name, an alert it
// sent, or a reply that was not TLS (a plain server behind rediss://).
// An alert from the node (a client certificate it wanted and was not sent:
// "remote error: tls: certificate required") comes as a *net.OpError of
// Op "remote error", crypto/tls's wording; tls.AlertError is QUIC's.
func isTLS(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" {
		return true
	}
	var (
		ve *tls.CertificateVerificationError
		ae tls.AlertError
		he tls.RecordHeaderError
		ua x509.UnknownAuthorityError
		hn x509.HostnameError
		ci x509.CertificateInvalidError
	)
	return errors.As(err, &ve) || errors.As(err, &ae) || errors.As(err, &he) ||
		errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci)
}

// isReply reports whether err is the server's own error reply.
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}
