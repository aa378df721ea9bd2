package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/fencekit/fence/cmd/fence/internal/termtext"
	"github.com/spf13/cobra"
)

// otherBackendSet refuses to read Redis when a variable makes fence exec
// take its locks from etcd or ZooKeeper, which status cannot read, and no
// Redis flag on the command line asks for Redis: status would report on a
// Redis lock (free, say, on a local Redis) that exec never took.
func otherBackendSet(cmd *cobra.Command) error {
	for _, f := range []string{"redis", "redis-sentinel", "redis-cluster"} {
		if cmd.Flags().Changed(f) {
			return nil
		}
	}
	for _, env := range []string{etcdEnv, "FENCE_ZOOKEEPER_SERVERS"} {
		if strings.TrimSpace(os.Getenv(env)) != "" {
			return fmt.Errorf("%s is set, so fence exec takes its locks there, but fence status reads only Redis and Redlock: give --redis, --redis-sentinel or --redis-cluster to read a Redis lock", env)
		}
	}
	return nil
}

func statusCmd() *cobra.Command {
	var rf redisFlags
	var rl redlockBackend
	var asJSON bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show whether a lock is held, its remaining lease and its last token",
		Long: `Status reads the lock called NAME without changing it and prints whether it is held, how
long the holder's lease has left, and the last fencing token issued for the name (0 when the
token record has expired or never existed), and how many replicas the primary is expected to
have and has connected (fewer connected than expected: acquisitions wait for replicas that
may not answer, and are refused), or why those counts could not be read ("replicas unknown",
the lock's state still shown). With --redlock it shows the lock on each node, and whether
a quorum holds it; a node that answered an error (READONLY from a replica's address, NOPERM,
WRONGPASS) or failed the TLS handshake (a certificate not trusted) is reached but not read,
and only one that did not answer is unreachable (each node of --json has "reached" and
"read"). It exits
0 whether the lock is held or free, and 2 on a usage or connection error, when the servers
have not answered within --timeout, or, with --redlock, when fewer nodes than a quorum are
read, or the nodes not read could make a quorum with those read that hold it (whether a
quorum holds it is then unknown).

It reads Redis and Redlock only: with FENCE_ETCD_ENDPOINTS or FENCE_ZOOKEEPER_SERVERS set
(fence exec then takes its locks there) and no --redis, --redis-sentinel or --redis-cluster
given, it exits 2 rather than read a Redis lock that exec never took.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 {
				return exitWith(ExitUsage, errors.New("--timeout must be positive, got "+timeout.String()))
			}
			// A server that accepts connections and never answers would
			// otherwise hold each command for go-redis's read timeout,
			// retried: 40 s for one Redis.
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			cmd.SetContext(ctx)
			if err := emptyBackendFlag(cmd, []backend{&rl}); err != nil {
				return exitWith(ExitUsage, err)
			}
			if rl.chosen() {
				// As fence exec: Redlock's masters (flag or variable)
				// with a Redis flag on the command line are two lock
				// services; reading one would say nothing of the other.
				for _, f := range []string{"redis", "redis-sentinel", "redis-cluster"} {
					if cmd.Flags().Changed(f) {
						return exitWith(ExitUsage, errors.New("give one lock service, not --redlock and --"+f))
					}
				}
				return redlockStatus(cmd, &rl, args[0], asJSON)
			}
			if err := otherBackendSet(cmd); err != nil {
				return exitWith(ExitUsage, err)
			}
			l, closeClient, err := rf.locker(cmd)
			if err != nil {
				return err
			}
			defer closeClient()
			s, err := l.Status(cmd.Context(), args[0])
			if err != nil {
				return exitWith(ExitUsage, rf.tlsHint(cmd.Context(), err))
			}
			out := cmd.OutOrStdout()
			// Counts that could not be read are unknown, not zero: null in
			// the JSON, with the reason (the server's text, escaped).
			var expected, connected any = s.Replicas.Expected, s.Replicas.Connected
			replicas := fmt.Sprintf("replicas %d expected, %d connected", s.Replicas.Expected, s.Replicas.Connected)
			var replicasErr string
			if s.ReplicasErr != nil {
				expected, connected = nil, nil
				replicasErr = s.ReplicasErr.Error()
				replicas = "replicas unknown: " + termtext.Escape(replicasErr)
			}
			if asJSON {
				j := map[string]any{
					"name": args[0], "held": s.Held, "ttl_ms": ttlMs(s.Held, s.TTL), "last_token": s.LastToken,
					"replicas_expected": expected, "replicas_connected": connected,
				}
				if replicasErr != "" {
					j["replicas_error"] = replicasErr
				}
				return encodeJSON(out, j)
			}
			state := "free"
			switch {
			case s.Held && s.TTL < 0:
				state = "held, without expiry"
			case s.Held:
				state = fmt.Sprintf("held, %v left", s.TTL.Round(time.Millisecond))
			}
			fmt.Fprintf(out, "%s: %s; last token %d; %s\n", args[0], state, s.LastToken, replicas)
			return nil
		},
	}
	rf.register(cmd)
	rl.register(cmd)
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "give up, with exit status 2, when the servers have not answered within this time")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object: name, held, ttl_ms (-1: held without expiry), last_token, replicas_expected, replicas_connected (both null when unknown, with replicas_error)")
	return cmd
}

// encodeJSON writes v as one line of JSON, its unprintable characters
// escaped (termtext.JSON): its strings can hold a server's text.
func encodeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(termtext.JSON(b), '\n'))
	return err
}

// ttlMs is a lock's remaining lease for --json, in milliseconds: -1 for a
// lock held without expiry (as Redis's PTTL says it). The libraries give
// that as a negative Duration of -1ns, whose Milliseconds() is 0: the JSON
// said "held, 0 ms left", a lock about to be free, of one that never will be.
func ttlMs(held bool, ttl time.Duration) int64 {
	if held && ttl < 0 {
		return -1
	}
	return ttl.Milliseconds()
}
