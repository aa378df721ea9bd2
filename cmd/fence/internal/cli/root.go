// Package cli is the fence command: exec, status and demo.
package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/fencekit/fence/cmd/fence/internal/progress"
	"github.com/fencekit/fence/cmd/fence/internal/termtext"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
)

// Exit codes that scripts can rely on. fence exec otherwise exits with its
// child's code (128 + the signal number if a signal ended the child).
const (
	ExitUsage       = 2   // bad flags or arguments, or no connection to the backend
	ExitNotAcquired = 75  // the lock was not acquired within --wait
	ExitLeaseLost   = 76  // the lease was lost while the child ran (the child was stopped), or before it started (not started)
	ExitInterrupted = 130 // SIGINT, SIGTERM or SIGHUP arrived while connecting, waiting for the lock, or before the command started; or during demo or doctor
)

// exitError carries an exit code out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitWith(code int, err error) error { return &exitError{code: code, err: err} }

// Main runs the fence command with args (without the program name) and
// returns the process's exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if isShim() {
		// fence exec re-executed as the command's parent: no command
		// line of its own, and not a command in help.
		return runShim(args)
	}
	libLog = newLibLogger(args, stderr)
	redis.SetLogger(libLog)
	// SIGHUP too (a terminal or ssh session closed): unhandled, it ended
	// fence by Go's default while exec waited for its acquisition's reply,
	// and the lock that acquisition took stayed held for a lease time
	// (TestExecHangupAcquireLeavesNoLock).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	root := rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(stderr, errorLine(ee.err, args))
		}
		return ee.code
	}
	fmt.Fprintln(stderr, errorLine(err, args))
	return ExitUsage
}

// errorLine is err as fence prints it: after "fence: ", said once (the
// library's errors begin with it too, and a flag's error wraps one), credentials in args scrubbed, and
// what a server put in it that a terminal would act on escaped.
func errorLine(err error, args []string) string {
	lines := strings.Split(scrub(err.Error(), args), "\n") // errors.Join's
	for i, l := range lines {
		lines[i] = termtext.Escape(l)
	}
	// A flag's error wraps the library's, which says "fence: " too.
	msg := sayFenceOnce(strings.Join(lines, "\n"))
	return "fence: " + strings.TrimPrefix(msg, "fence: ")
}

// sayFenceOnce drops the "fence: " of a library error wrapped by one of
// fence's own (": fence: " becomes ": "), except inside the quoted
// strings the errors hold (%q: a lock name may say ": fence: " too).
func sayFenceOnce(msg string) string {
	const wrapped = ": fence: "
	if !strings.Contains(msg, wrapped) {
		return msg
	}
	var b strings.Builder
	for i := 0; i < len(msg); {
		switch {
		case msg[i] == '"':
			if q, err := strconv.QuotedPrefix(msg[i:]); err == nil {
				b.WriteString(q)
				i += len(q)
				continue
			}
		case strings.HasPrefix(msg[i:], wrapped):
			b.WriteString(": ")
			i += len(wrapped)
			continue
		}
		b.WriteByte(msg[i])
		i++
	}
	return b.String()
}

// libLogger is go-redis's logger for fence: its lines go to stderr
// without the secrets of fence's URLs, or, while a status line is shown
// there (exec waiting for its lock), through it, so that each starts a line
// of its own rather than after the spinner's text.
type libLogger struct {
	args []string
	mu   sync.Mutex
	w    io.Writer
	// waiting: exec waits for its lock (--wait); dialShown: a dial
	// failure was shown meanwhile (see dialNoise). Guarded by mu.
	waiting, dialShown bool
}

// libLog is the logger Main gave go-redis; nil before Main.
var libLog *libLogger

func newLibLogger(args []string, w io.Writer) *libLogger { return &libLogger{args: args, w: w} }

// Printf writes one line, unless it is go-redis's note on its own pool
// (poolNoise, drainNoise, dialNoise).
func (l *libLogger) Printf(_ context.Context, format string, v ...any) {
	text := fmt.Sprintf(format, v...)
	if strings.Contains(text, poolNoise) || strings.Contains(text, drainNoise) {
		return
	}
	dial := strings.Contains(text, dialNoise)
	line := termtext.Escape(scrub(text, l.args)) + "\n"
	l.mu.Lock()
	defer l.mu.Unlock()
	if dial {
		if !l.waiting || l.dialShown {
			return
		}
		l.dialShown = true
	}
	_, _ = io.WriteString(l.w, line)
}

// waitingForLock marks exec's wait for its lock until the returned func is
// called: the first dial failure meanwhile is shown (see dialNoise).
func (l *libLogger) waitingForLock() (done func()) {
	if l == nil {
		return func() {}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waiting = true
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.waiting = false
	}
}

// poolNoise is in the line go-redis logs when a connection it hands out is
// closed under it, as a subscription's is when exec stops waiting (the
// subscription is closed while its reader still reads): a note on go-redis's
// own bookkeeping, with nothing for a fence user to do. Printed, it came
// before exec's own error on stderr, now and then, under load
// (TestExecUsageAndNotAcquired: stderr "Unexpected conn[1] state changed by
// hook to CLOSED, closing it\nfence: lock not acquired: ...").
const poolNoise = "state changed by hook to CLOSED"

// drainNoise begins the line go-redis logs when a connection had unread
// input before a command was sent: it closes the connection and runs the
// command again on a fresh one, and the command's own error says what went
// wrong if that fails too. Over TLS 1.3 a server that refuses the client's
// certificate says so after the handshake, so each try logged it: status
// printed the same "remote error: tls: unknown certificate authority" eight
// times before its own error (TestTLSClientCertificateWrong).
const drainNoise = "push: pre-command drain failed, retiring conn"

// dialNoise is in the line go-redis logs each time a command finds no
// connection because its dials failed: the command's error, which fence
// reports, says the same. A server that refused connections printed
// "redis: connection pool: failed to dial after 5 attempts: dial tcp ...:
// connection refused" four times before exec's own error
// (TestExecServerDownOneErrorLine). While exec waits for its lock
// (--wait), the first is shown all the same: without it exec said nothing
// for the whole budget against a server down throughout, and on a
// terminal its "waiting for" line read as a lock held by another
// (TestExecWaitServerDownSaysSo).
const dialNoise = "connection pool: failed to dial after"

// divert sends the lines to w until the returned func is called.
func (l *libLogger) divert(w io.Writer) (restore func()) {
	if l == nil {
		return func() {}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	old := l.w
	l.w = w
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.w = old
	}
}

// stderrIsTerminal decides whether the command shows progress on stderr (a
// status line rewritten in place): only on a terminal. Tests replace it.
var stderrIsTerminal = progress.IsTerminal

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "fence",
		Short: "Distributed locks with fencing tokens",
		Long: `Fence takes distributed locks whose every acquisition carries a fencing token: a number larger
than every token issued before it for the same lock name. Pass the token with each write and
have the protected resource reject tokens lower than one it has already accepted; then a
worker that paused past its lease, or a lock lost in a failover, cannot overwrite newer work.

Start with "fence demo".`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(execCmd(), statusCmd(), demoCmd(), labCmd(), doctorCmd())
	return root
}

// redisFlags are the flags of commands that talk to Redis.
type redisFlags struct {
	url, sentinelURL, clusterURL string
	watchdogTTL                  time.Duration
	noSync                       bool
	acks                         string
	replicas                     int

	// standalone is --redis's options as the command's client was built
	// with them (TLS files read once: they may be pipes), for tlsHint;
	// nil for Sentinel and Cluster.
	standalone *redis.Options
}

func (f *redisFlags) register(cmd *cobra.Command) {
	// The defaults come from the environment so that passwords need not
	// appear in the process list. Help shows them redacted: pflag prints a
	// flag's DefValue, which is set apart from the value used.
	urlFlag := func(p *string, name, envVar, def, usage string) {
		v := def
		if e := os.Getenv(envVar); e != "" {
			v = e
		}
		cmd.Flags().StringVar(p, name, v, usage)
		cmd.Flags().Lookup(name).DefValue = redactURL(v)
	}
	urlFlag(&f.url, "redis", "FENCE_REDIS_URL", "redis://127.0.0.1:6379",
		"URL of a standalone Redis (redis://, rediss:// for TLS, user:password@ for ACL users). "+
			"rediss:// checks each server's certificate against the system's CAs and the host it dials; "+
			"to trust a private CA set SSL_CERT_FILE to a PEM file holding it (in place of the system's CAs: add them to the file if other servers need them) or SSL_CERT_DIR to a directory; "+
			"or give --redis-tls-ca; skip_verify=true in the URL turns the check off (anyone on the path can then pose as the server); a server that asks for a client certificate (tls-auth-clients yes) gets --redis-tls-cert and --redis-tls-key. "+
			"The default comes from FENCE_REDIS_URL, so that passwords need not appear in the process list, else redis://127.0.0.1:6379. "+
			"Passwords are shown masked")
	urlFlag(&f.sentinelURL, "redis-sentinel", "FENCE_REDIS_SENTINEL_URL", "",
		"URL of Redis Sentinels instead, with the master's name: redis://sentinel1:26379?master_name=mymaster&addr=sentinel2:26379 "+
			"(default from FENCE_REDIS_SENTINEL_URL)")
	urlFlag(&f.clusterURL, "redis-cluster", "FENCE_REDIS_CLUSTER_URL", "",
		"URL of a Redis Cluster instead, naming one or more nodes: redis://node1:6379?addr=node2:6379 (default from FENCE_REDIS_CLUSTER_URL)")
	registerTLSFlags(cmd)
	cmd.Flags().DurationVar(&f.watchdogTTL, "watchdog-ttl", redislock.DefaultWatchdogTTL,
		"lease time of a lease held without --ttl; the watchdog renews it every third of this")
	cmd.Flags().BoolVar(&f.noSync, "no-replica-sync", false,
		"do not confirm acquisitions with WAIT on the primary's replicas (by default one replica must acknowledge within 1 s, less with a read_timeout under 2.1s; a read_timeout of 101ms or less is refused unless this is set)")
	cmd.Flags().StringVar(&f.acks, "acks", "1",
		"how many replicas must acknowledge an acquisition or renewal within 1 s (less with a read_timeout under 2.1s): a number, majority (more than half of the expected replicas) or all")
	cmd.Flags().IntVar(&f.replicas, "replicas", 0,
		"how many replicas the primary is expected to have; 0 reads it from the primary (INFO replication)")
}

// parseAcks reads --acks: a positive number, "majority" or "all".
func parseAcks(s string) (int, error) {
	switch strings.ToLower(s) {
	case "majority":
		return redislock.AcksMajority, nil
	case "all":
		return redislock.AcksAll, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("--acks %q: want a number of replicas (1 or more), majority or all; --no-replica-sync turns the check off", s)
	}
	return n, nil
}

// replicaSync is the redislock.ReplicaSync the flags describe.
func (f *redisFlags) replicaSync(changed func(string) bool) (redislock.ReplicaSync, error) {
	if f.noSync {
		if changed("acks") || changed("replicas") {
			return redislock.ReplicaSync{}, errors.New("--acks and --replicas configure replica sync, which --no-replica-sync turns off")
		}
		return redislock.ReplicaSync{Disabled: true}, nil
	}
	acks, err := parseAcks(f.acks)
	if err != nil {
		return redislock.ReplicaSync{}, err
	}
	if f.replicas < 0 {
		return redislock.ReplicaSync{}, fmt.Errorf("--replicas %d: want 0 (read from the primary) or more", f.replicas)
	}
	if f.replicas > 0 && acks > f.replicas {
		return redislock.ReplicaSync{}, fmt.Errorf("--acks %d is more than --replicas %d: no acquisition could succeed", acks, f.replicas)
	}
	return redislock.ReplicaSync{Acks: acks, Replicas: f.replicas}, nil
}

// parseError reports a URL that go-redis refused without the URL's
// credentials: go-redis's errors may quote the URL or parts of it (url.Parse
// quotes it whole). The error comes from parsing the redacted URL instead;
// if that one parses, the trouble lies in the masked part.
func parseError(flag, raw string, parse func(string) error) error {
	red := redactURL(raw)
	if err := parse(red); err != nil {
		return fmt.Errorf("%s %s: %s", flag, red, scrubOne(err.Error(), raw))
	}
	return fmt.Errorf("%s %s: the user:password part is not valid in a URL (percent-encode characters such as / ? # @ %% and :)", flag, red)
}

// scrubOne removes raw's secrets from msg.
func scrubOne(msg, raw string) string {
	for _, s := range urlSecrets(raw) {
		msg = strings.ReplaceAll(msg, s, mask)
	}
	return msg
}

// parseURL, parseFailoverURL and parseClusterURL parse the URL given to
// flag as go-redis does, with errors that name the flag and hide the
// password, and refuse pool sizes out of checkPool's range. A rediss://
// URL's TLS config verifies each server against the host it is dialled by
// (see dialledName) and carries ct's client certificate and CAs (a nil ct
// adds none; with a redis:// URL a non-nil one is an error).
func parseURL(flag, raw string, ct *clientTLS) (*redis.Options, error) {
	o, err := redis.ParseURL(raw)
	if err != nil {
		return nil, parseError(flag, raw, func(s string) error { _, err := redis.ParseURL(s); return err })
	}
	if err := ct.apply(flag, raw, o.TLSConfig); err != nil {
		return nil, err
	}
	dialledName(o.TLSConfig)
	o.DialerRetries = oneTLSDial(o.TLSConfig, o.DialerRetries)
	return o, checkPool(flag, raw, o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns)
}

func parseFailoverURL(flag, raw string, ct *clientTLS) (*redis.FailoverOptions, error) {
	o, err := redis.ParseFailoverURL(raw)
	if err != nil {
		return nil, parseError(flag, raw, func(s string) error { _, err := redis.ParseFailoverURL(s); return err })
	}
	if err := ct.apply(flag, raw, o.TLSConfig); err != nil {
		return nil, err
	}
	dialledName(o.TLSConfig)
	o.DialerRetries = oneTLSDial(o.TLSConfig, o.DialerRetries)
	return o, checkPool(flag, raw, o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns)
}

func parseClusterURL(flag, raw string, ct *clientTLS) (*redis.ClusterOptions, error) {
	o, err := redis.ParseClusterURL(raw)
	if err != nil {
		return nil, parseError(flag, raw, func(s string) error { _, err := redis.ParseClusterURL(s); return err })
	}
	if err := ct.apply(flag, raw, o.TLSConfig); err != nil {
		return nil, err
	}
	dialledName(o.TLSConfig)
	o.DialerRetries = oneTLSDial(o.TLSConfig, o.DialerRetries)
	return o, checkPool(flag, raw, o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns)
}

// oneTLSDial returns the dial attempts for a connection: 1 for a rediss://
// URL that does not say (dialer_retries), else retries. go-redis makes up
// to 5 attempts per connection, each up to dial_timeout; over TLS the
// handshake is part of the dial, so a server that accepts and never
// answers it held exec --wait 0 (bounded by the client's timeouts, the
// help says) for 5 dial timeouts: 26.6 s with the defaults, against 6.6 s
// for the same silence over plain TCP. Retrying a refused dial is
// redislock's part, within --wait.
func oneTLSDial(c *tls.Config, retries int) int {
	if c != nil && retries == 0 {
		return 1
	}
	return retries
}

// dialledName clears the ServerName go-redis puts in a rediss:// URL's TLS
// config: the URL's (first) host, which one config then checks every
// server's certificate against, the primary a Sentinel names, the nodes of
// a cluster and the replicas the doctor finds included. Without it the
// TLS dial checks each certificate against the host it dials, which for
// the URL's own host is the same name.
func dialledName(c *tls.Config) {
	if c != nil {
		c.ServerName = ""
	}
}

// maxPool bounds the connection counts a URL may ask for: go-redis sets
// aside PoolSize slots up front and dials MinIdleConns connections at once,
// and panics in NewClient beyond 2^31 - 1, so a slip such as
// pool_size=9999999999 crashed fence (found by FuzzRedisURL).
const maxPool = 10000

// checkPool refuses a pool size, minimum or maximum of idle connections,
// or maximum of active ones below 0 or above maxPool.
func checkPool(flag, raw string, poolSize, minIdle, maxIdle, maxActive int) error {
	for _, v := range []struct {
		name string
		n    int
	}{{"pool_size", poolSize}, {"min_idle_conns", minIdle}, {"max_idle_conns", maxIdle}, {"max_active_conns", maxActive}} {
		if v.n < 0 || v.n > maxPool {
			return fmt.Errorf("%s %s: %s=%d is out of range (0 to %d)", flag, redactURL(raw), v.name, v.n, maxPool)
		}
	}
	return nil
}

// oneRedis refuses --redis given on the command line together with a
// Sentinel or Cluster URL, from its flag or its environment variable: that
// URL would win, and the lock would be taken on another Redis than the one
// --redis names. (FENCE_REDIS_URL with one of them is a default, and they
// take precedence over it.)
func (f *redisFlags) oneRedis(changed func(string) bool) error {
	if !changed("redis") {
		return nil
	}
	for _, o := range []struct{ flag, env, url string }{
		{"redis-sentinel", "FENCE_REDIS_SENTINEL_URL", f.sentinelURL},
		{"redis-cluster", "FENCE_REDIS_CLUSTER_URL", f.clusterURL},
	} {
		if o.url == "" {
			continue
		}
		from := "--" + o.flag
		if !changed(o.flag) {
			from = o.env
		}
		return fmt.Errorf("give one of --redis, --redis-sentinel and --redis-cluster, not --redis and %s", from)
	}
	return nil
}

// client builds the go-redis client the flags describe, with ct's TLS
// files (see redisTLS).
func (f *redisFlags) client(ct *clientTLS) (redis.UniversalClient, error) {
	switch {
	case f.sentinelURL != "" && f.clusterURL != "":
		return nil, errors.New("give --redis-sentinel or --redis-cluster, not both")
	case f.sentinelURL != "":
		o, err := parseFailoverURL("--redis-sentinel", f.sentinelURL, ct)
		if err != nil {
			return nil, err
		}
		if o.MasterName == "" {
			return nil, errors.New("--redis-sentinel: the URL needs master_name=NAME")
		}
		return redis.NewFailoverClient(o), nil
	case f.clusterURL != "":
		o, err := parseClusterURL("--redis-cluster", f.clusterURL, ct)
		if err != nil {
			return nil, err
		}
		return redis.NewClusterClient(o), nil
	default:
		o, err := parseURL("--redis", f.url, ct)
		if err != nil {
			return nil, err
		}
		f.standalone = o
		return redis.NewClient(o), nil
	}
}

// locker connects to Redis; the returned func closes the client.
func (f *redisFlags) locker(cmd *cobra.Command) (*redislock.Locker, func(), error) {
	if err := f.oneRedis(cmd.Flags().Changed); err != nil {
		return nil, nil, exitWith(ExitUsage, err)
	}
	rs, err := f.replicaSync(cmd.Flags().Changed)
	if err != nil {
		return nil, nil, exitWith(ExitUsage, err)
	}
	ct, err := redisTLS(cmd)
	if err != nil {
		return nil, nil, exitWith(ExitUsage, err)
	}
	client, err := f.client(ct)
	if err != nil {
		return nil, nil, exitWith(ExitUsage, err)
	}
	l, err := redislock.New(client, &redislock.Options{
		WatchdogTTL: f.watchdogTTL,
		ReplicaSync: rs,
	})
	if err != nil {
		_ = client.Close()
		return nil, nil, exitWith(ExitUsage, err)
	}
	return l, func() {
		// An Acquire cut short (^C) may have taken the lock on the
		// server; its give-back runs in the background and would die
		// with fence, leaving the lock held for its lease time.
		ctx, cancel := context.WithTimeout(context.Background(), giveBackTimeout)
		defer cancel()
		_ = l.WaitGiveBacks(ctx)
		closeWithin(client, redisCloseTimeout)
	}, nil
}

// giveBackTimeout bounds the wait for the give-backs of an Acquire cut short
// before fence closes its client (see redislock's WaitGiveBacks): a server
// that answers takes a round trip; one that does not keeps fence no longer.
const giveBackTimeout = time.Second

// redisCloseTimeout bounds the wait for the Redis client's Close before
// fence exits: go-redis's failover client closes only once a master lookup
// in flight has ended, which a sentinel that never answers holds for its
// own timeouts (5 s), well past a command's --timeout. What is left open
// dies with the process.
const redisCloseTimeout = 500 * time.Millisecond

// closeWithin closes c, waiting at most limit for it.
func closeWithin(c io.Closer, limit time.Duration) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Close()
	}()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// acquireError maps an Acquire error to an exit code.
func acquireError(err error) error {
	switch {
	case errors.Is(err, fence.ErrInvalidName), errors.Is(err, fence.ErrInvalidOption):
		return exitWith(ExitUsage, err)
	case errors.Is(err, fence.ErrHeld), errors.Is(err, fence.ErrNotReplicated):
		// (Not context.DeadlineExceeded: exec's context has no
		// deadline, and every backend says ErrHeld when --wait ends with
		// the lock held; a deadline inside a client, such as go-redis's
		// Sentinel lookup, is a connection error.)
		return exitWith(ExitNotAcquired, err)
	case errors.Is(err, context.Canceled):
		return exitWith(ExitInterrupted, err)
	case errors.Is(err, fence.ErrLeaseLost):
		// Taken, but the reply came after the lease's deadline (a
		// starved or paused server, a lease of a few ms): given back,
		// the command not started.
		return exitWith(ExitLeaseLost, fmt.Errorf("lease lost before the command started; not started: %w", err))
	default:
		return exitWith(ExitUsage, err)
	}
}
