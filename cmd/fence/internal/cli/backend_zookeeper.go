package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
	"github.com/spf13/cobra"
)

// zookeeperBackend takes the lock from ZooKeeper (zklock): --zookeeper
// names the servers, comma-separated, as FENCE_ZOOKEEPER_SERVERS may.
type zookeeperBackend struct {
	servers        string
	sessionTimeout time.Duration
	root           string
}

func (b *zookeeperBackend) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&b.servers, "zookeeper", os.Getenv("FENCE_ZOOKEEPER_SERVERS"),
		"take the lock from ZooKeeper instead of Redis: its servers, comma-separated host:port, without a chroot path (see --zookeeper-root) "+
			"(default from FENCE_ZOOKEEPER_SERVERS); the token is the lock node's creation zxid")
	cmd.Flags().DurationVar(&b.sessionTimeout, "zookeeper-session-timeout", 10*time.Second,
		"ZooKeeper session timeout: the lease of a holder that no server hears from ends after this long")
	cmd.Flags().StringVar(&b.root, "zookeeper-root", zklock.DefaultRoot, "znode under which the locks live")
}

func (b *zookeeperBackend) flag() string { return "zookeeper" }

func (b *zookeeperBackend) chosen() bool { return b.servers != "" }

// quietLogger drops go-zookeeper's connection chatter; failures come back
// as errors.
type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

func (b *zookeeperBackend) locker(cmd *cobra.Command) (fence.Locker, func(), error) {
	var servers []string
	for s := range strings.SplitSeq(b.servers, ",") {
		if s = strings.TrimSpace(s); s != "" {
			servers = append(servers, s)
		}
	}
	if i := strings.IndexByte(b.servers, '/'); i >= 0 {
		// A chroot ("host:2181/app", as zkCli.sh takes it): go-zookeeper
		// has none, and would dial "2181/app" as a port until the session
		// timeout.
		return nil, nil, exitWith(ExitUsage, fmt.Errorf("--zookeeper %q: a chroot path (%q) is not supported: name the servers alone and the znode with --zookeeper-root",
			b.servers, b.servers[i:]))
	}
	if len(servers) == 0 {
		return nil, nil, exitWith(ExitUsage, fmt.Errorf("--zookeeper %q: no server", b.servers))
	}
	if err := fence.ValidateTTL(b.sessionTimeout); err != nil {
		return nil, nil, exitWith(ExitUsage, fmt.Errorf("--zookeeper-session-timeout %v: %w", b.sessionTimeout, err))
	}
	// The connection's logger records the session timeouts the servers
	// grant, which leases count their deadlines from (no probe session).
	st := zklock.NewSessionTimeouts(quietLogger{})
	conn, _, err := zk.Connect(servers, b.sessionTimeout, zk.WithLogger(st))
	if err != nil {
		return nil, nil, exitWith(ExitUsage, fmt.Errorf("--zookeeper %s: %w", b.servers, err))
	}
	// Connect returns before it connects: wait for a session, up to the
	// session timeout, or until a signal (SIGINT, SIGTERM) ends exec's
	// context: that is an interruption (exit 130), not a wait for the rest
	// of the session timeout.
	ctx := cmd.Context()
	end := time.NewTimer(b.sessionTimeout)
	defer end.Stop()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for conn.State() != zk.StateHasSession {
		select {
		case <-ctx.Done():
			conn.Close()
			return nil, nil, exitWith(ExitInterrupted, fmt.Errorf("--zookeeper %s: waiting for a session: %w", b.servers, ctx.Err()))
		case <-end.C:
			conn.Close()
			return nil, nil, exitWith(ExitUsage, fmt.Errorf("--zookeeper %s: no session within %v", b.servers, b.sessionTimeout))
		case <-poll.C:
		}
	}
	l, err := zklock.New(conn, b.sessionTimeout, zklock.WithRoot(b.root), zklock.WithSessionTimeouts(st))
	if err != nil {
		conn.Close()
		return nil, nil, exitWith(ExitUsage, errors.Join(errors.New("--zookeeper-root or --zookeeper-session-timeout"), err))
	}
	return l, conn.Close, nil
}
