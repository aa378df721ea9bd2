package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdEnv holds the default of --etcd. It may carry a user and password
// (http://user:password@host:2379), so credentialVar keeps it, like every
// FENCE_ETCD_ variable, from the command exec runs.
const etcdEnv = "FENCE_ETCD_ENDPOINTS"

// etcdDialTimeout bounds the first contact with the cluster, which exec
// makes before it acquires, so that an unreachable cluster is a connection
// error (exit 2) rather than a wait without end.
const etcdDialTimeout = 5 * time.Second

// etcdBackend takes the lock from an etcd cluster (etcdlock), chosen with
// --etcd or FENCE_ETCD_ENDPOINTS.
type etcdBackend struct {
	endpoints string
}

func (b *etcdBackend) register(cmd *cobra.Command) {
	v := os.Getenv(etcdEnv)
	cmd.Flags().StringVar(&b.endpoints, "etcd", v,
		"comma-separated etcd endpoints to take the lock from instead of Redis: http://127.0.0.1:2379,http://10.0.0.2:2379 "+
			"(https:// for TLS with the system's roots, user:password@ for etcd's auth). The default comes from "+etcdEnv+". "+
			"The token is the lock key's create revision. Passwords are shown masked")
	cmd.Flags().Lookup("etcd").DefValue = redactEndpoints(v)
}

func (b *etcdBackend) flag() string { return "etcd" }

func (b *etcdBackend) chosen() bool { return b.endpoints != "" }

// redactEndpoints masks the password of each endpoint.
func redactEndpoints(s string) string {
	parts := splitURLs(s)
	for i, p := range parts {
		parts[i] = redactURL(p)
	}
	return strings.Join(parts, ",")
}

// etcdConfig is the client configuration of a list of endpoints: the
// user and password come out of the URLs into the config, and must be the
// same on every endpoint that has them.
func etcdConfig(list string) (clientv3.Config, error) {
	cfg := clientv3.Config{DialTimeout: etcdDialTimeout, Logger: zap.NewNop()}
	var user, pass string
	for _, raw := range splitURLs(list) {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		if !strings.Contains(raw, "://") {
			raw = "http://" + raw
		}
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			return cfg, fmt.Errorf("--etcd %s: want http://host:port or https://host:port", redactURL(raw))
		}
		if u.User != nil {
			p, _ := u.User.Password()
			if user != "" && (u.User.Username() != user || p != pass) {
				return cfg, errors.New("--etcd: the endpoints name different users or passwords")
			}
			user, pass = u.User.Username(), p
		}
		if u.Scheme == "https" {
			cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		cfg.Endpoints = append(cfg.Endpoints, u.Scheme+"://"+u.Host)
	}
	if len(cfg.Endpoints) == 0 {
		return cfg, errors.New("--etcd: no endpoint")
	}
	cfg.Username, cfg.Password = user, pass
	return cfg, nil
}

func (b *etcdBackend) locker(cmd *cobra.Command) (fence.Locker, func(), error) {
	cfg, err := etcdConfig(b.endpoints)
	if err != nil {
		return nil, nil, exitWith(ExitUsage, err)
	}
	watchdog, err := cmd.Flags().GetDuration("watchdog-ttl")
	if err != nil {
		return nil, nil, exitWith(ExitUsage, err)
	}
	client, err := clientv3.New(cfg)
	if err != nil {
		return nil, nil, exitWith(ExitUsage, fmt.Errorf("etcd %s: %w", strings.Join(cfg.Endpoints, ","), err))
	}
	// One read, so that a cluster that cannot be reached is reported as
	// such within etcdDialTimeout.
	ctx, cancel := context.WithTimeout(cmd.Context(), etcdDialTimeout)
	defer cancel()
	if _, err := client.Get(ctx, etcdlock.DefaultPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		_ = client.Close()
		code := ExitUsage
		if cmd.Context().Err() != nil {
			code = ExitInterrupted // a signal (SIGINT, SIGTERM) while connecting
		}
		return nil, nil, exitWith(code, fmt.Errorf("etcd %s: %w", strings.Join(cfg.Endpoints, ","), err))
	}
	l, err := etcdlock.New(client, &etcdlock.Options{WatchdogTTL: watchdog})
	if err != nil {
		_ = client.Close()
		return nil, nil, exitWith(ExitUsage, err)
	}
	stderr := cmd.ErrOrStderr()
	closeLocker := func() {
		// As the Redlock backend's: the Locker's background work (a
		// revoke retried, an Extend's move being settled; the spare etcd
		// leases it keeps for reuse) would die with the client, leaving
		// keys on etcd leases nobody renews until they expire.
		ctx, cancel := context.WithTimeout(context.Background(), etcdCloseTimeout)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			fmt.Fprintf(stderr, "fence: %s (what was not revoked expires with its etcd lease)\n", scrub(err.Error(), []string{"--etcd", b.endpoints}))
		}
		_ = client.Close()
	}
	return l, closeLocker, nil
}

// etcdCloseTimeout bounds the wait, before fence exits, for the etcd
// Locker's background work (see etcdlock.Locker.Close), whatever the
// command's context: it runs after a signal too.
const etcdCloseTimeout = 3 * time.Second
