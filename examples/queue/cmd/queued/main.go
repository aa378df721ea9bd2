// Command queued runs a consumer of the queue example, against Redis (the
// stream, its consumer group and the leader's lock) and PostgreSQL (the
// effects), or produces messages for it.
//
//	go run ./examples/queue/cmd/queued -produce 1000   # append 1000 messages and exit
//	go run ./examples/queue/cmd/queued -id order-17    # append one message with your id
//	go run ./examples/queue/cmd/queued &               # consumers: run two or more;
//	go run ./examples/queue/cmd/queued &               # one leads, the others wait
//
// The consumer campaigns with fence.Lead for the lock queue:<stream>:<group>
// (redislock with its defaults but the lease time -lease: replica sync is
// on, and on a primary that never had a replica, such as a lone
// redis-server, it waits for none) and, while it leads,
// applies each message in a transaction fenced with its token; see package
// queue. Its PostgreSQL sessions get idle_in_transaction_session_timeout
// (-idle-tx, default the lease time) unless -db sets it, so that a consumer
// paused inside its transaction holds the new leader up for that long at
// most, and a connect_timeout of the lease time (unless -db sets one), so
// that a database that accepts and never answers is an error, not a hang.
// A Redis or PostgreSQL that does not answer within a lease time at the
// start makes it exit with an error. It logs one line per message and
// term; SIGINT or SIGTERM stops it, cutting the transaction under way
// (rolled back, its message stays pending for the next leader). -h shows
// the defaults taken from the environment with their passwords hidden.
//
// For tests, the environment variable QUEUED_TEST_STOP=<point>:<n>, point
// before-fence or before-commit, makes the consumer log "stop" and stop
// itself with SIGSTOP (Linux) at that point of the n-th message it handles,
// once; it goes on when it receives SIGCONT.
package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/queue"
	"github.com/fencekit/fence/internal/child"
	"github.com/fencekit/fence/redislock"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
)

// StopEnv names the test-only environment variable; see the command's doc.
const StopEnv = "QUEUED_TEST_STOP"

type config struct {
	redis, db     secret
	stream, group string
	name          string
	lease         time.Duration
	minIdle       time.Duration
	idleTx        time.Duration
	batch         int
	produce       int
	id            string
	json          bool
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err == nil {
		err = run(cfg, os.Getenv(StopEnv))
	}
	if err != nil {
		slog.Error("queued", "err", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, getenv func(string) string, out io.Writer) (config, error) {
	fs := flag.NewFlagSet("queued", flag.ContinueOnError)
	fs.SetOutput(out)
	host, _ := os.Hostname()
	cfg := config{
		redis: secret(envOr(getenv, "FENCE_REDIS_URL", "redis://127.0.0.1:6379")),
		db:    secret(envOr(getenv, "QUEUE_DB", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")),
	}
	fs.Var(&cfg.redis, "redis", "Redis URL for the stream and the lock (env FENCE_REDIS_URL)")
	fs.Var(&cfg.db, "db", "postgres:// URL for the effects (env QUEUE_DB)")
	fs.StringVar(&cfg.stream, "stream", "jobs", "stream key")
	fs.StringVar(&cfg.group, "group", "appliers", "consumer group")
	fs.StringVar(&cfg.name, "name", fmt.Sprintf("%s-%d", host, os.Getpid()), "consumer name, one per process")
	fs.DurationVar(&cfg.lease, "lease", 10*time.Second, "lease time of the leader's lock (the watchdog renews it every third)")
	fs.DurationVar(&cfg.minIdle, "min-idle", 0, "XAUTOCLAIM's min-idle-time during a term (a new leader claims every pending entry at once); 0 means the lease time")
	fs.DurationVar(&cfg.idleTx, "idle-tx", 0, "idle_in_transaction_session_timeout for the consumer's sessions, unless -db sets it; 0 means the lease time")
	fs.IntVar(&cfg.batch, "batch", queue.DefaultBatch, "entries per XREADGROUP or XAUTOCLAIM")
	fs.IntVar(&cfg.produce, "produce", 0, "append this many messages to the stream and exit, instead of consuming")
	fs.StringVar(&cfg.id, "id", "", "with -produce 1 (which it implies), the message's id: an idempotency key of the caller's (queue.ProduceID), so that running the command again after an error applies the message once")
	fs.BoolVar(&cfg.json, "json", false, "log JSON lines instead of text")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if cfg.lease <= 0 || cfg.minIdle < 0 || cfg.idleTx < 0 || cfg.batch <= 0 || cfg.produce < 0 {
		return cfg, fmt.Errorf("-lease and -batch must be positive, -min-idle, -idle-tx and -produce not negative")
	}
	// PostgreSQL counts idle_in_transaction_session_timeout in whole
	// milliseconds, and 0 turns it off: -idle-tx 500us would have left a
	// stalled consumer's transaction open for good.
	if cfg.idleTx > 0 && cfg.idleTx < time.Millisecond {
		return cfg, fmt.Errorf("-idle-tx %v: under a millisecond, which PostgreSQL would take for 0 (no timeout)", cfg.idleTx)
	}
	if cfg.id != "" {
		if cfg.produce > 1 {
			return cfg, fmt.Errorf("-id names one message: -produce %d with -id", cfg.produce)
		}
		cfg.produce = 1
	}
	return cfg, nil
}

func run(cfg config, stop string) error {
	var h slog.Handler = slog.NewTextHandler(os.Stderr, nil)
	if cfg.json {
		h = slog.NewJSONHandler(os.Stderr, nil)
	}
	log := slog.New(h)
	opt, err := redis.ParseURL(string(cfg.redis))
	if err != nil {
		// The parse error quotes the URL, password and all.
		return fmt.Errorf("-redis: cannot parse %s", cfg.redis)
	}
	// A cancelled context interrupts a blocked XREADGROUP, so that a
	// deposed leader stops reading at once.
	opt.ContextTimeoutEnabled = true
	client := redis.NewClient(opt)
	defer client.Close()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if cfg.produce > 0 {
		return produce(ctx, client, cfg.stream, cfg.id, cfg.produce, log)
	}
	hook, err := stopHook(stop, log)
	if err != nil {
		return err
	}
	// fence.Lead retries a failed acquisition for good, and logs nothing:
	// a Redis that is down (or a wrong -redis) at the start is an error,
	// as a PostgreSQL that is down is (creating the schema).
	pctx, pcancel := context.WithTimeout(ctx, cfg.lease)
	err = client.Ping(pctx).Err()
	pcancel()
	if err != nil {
		return fmt.Errorf("-redis %s: %w", cfg.redis, err)
	}
	dsn, err := withTimeouts(string(cfg.db), cmp.Or(cfg.idleTx, cfg.lease), cfg.lease)
	if err != nil {
		return fmt.Errorf("-db %s: %w", cfg.db, err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return fmt.Errorf("-db %s: %w", cfg.db, err)
	}
	defer db.Close()
	if err := queue.CreateSchema(ctx, db); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	locker, err := redislock.New(client, &redislock.Options{WatchdogTTL: cfg.lease})
	if err != nil {
		return err
	}
	c := &queue.Consumer{
		Redis: client, DB: db, Stream: cfg.stream, Group: cfg.group, Name: cfg.name,
		MinIdle: cfg.minIdle, Batch: cfg.batch, Pause: hook, Log: log,
	}
	if c.MinIdle == 0 {
		c.MinIdle = cfg.lease
	}
	log.Info("consumer", "name", cfg.name, "stream", cfg.stream, "group", cfg.group, "lease", cfg.lease, "min_idle", c.MinIdle)
	err = c.Run(ctx, locker, fence.OnDeposed(func(l fence.Lease, err error) {
		log.Info("deposed", "consumer", cfg.name, "token", int64(l.Token()), "err", err)
	}))
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// withTimeouts returns the postgres:// URL dsn with the runtime parameter
// idle_in_transaction_session_timeout set to idle, and pgx's
// connect_timeout to connect (in whole seconds, rounded up), unless dsn
// sets them. The first makes the server end the session of a consumer
// paused inside its transaction (after the fence, holding the message's
// fence row) once it has been idle for idle, so that the new leader waits
// for it at most that long, and the paused consumer's commit fails when
// it wakes. The second bounds each connection's set-up: without it pgx
// waits for a server that accepts and never answers for good, and the
// consumer hung at its start, creating the schema, with nothing logged.
func withTimeouts(dsn string, idle, connect time.Duration) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", errors.New("want a postgres:// URL")
	}
	q := u.Query()
	if !q.Has("idle_in_transaction_session_timeout") {
		q.Set("idle_in_transaction_session_timeout", strconv.FormatInt(idle.Milliseconds(), 10))
	}
	if !q.Has("connect_timeout") {
		q.Set("connect_timeout", strconv.FormatInt(int64((connect+time.Second-1)/time.Second), 10))
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// produce appends n messages: account acct-(i mod 10), amount i, each
// with a random message id (queue.Produce); or, if id is set, the one
// message of n = 1 with that id (queue.ProduceID, which refuses an invalid
// one with queue.ErrInvalidID before appending anything).
func produce(ctx context.Context, client *redis.Client, stream, id string, n int, log *slog.Logger) error {
	var sum int64
	for i := 1; i <= n; i++ {
		account, amount := fmt.Sprintf("acct-%d", i%10), int64(i)
		var err error
		if id != "" {
			_, err = queue.ProduceID(ctx, client, stream, id, account, amount)
		} else {
			_, err = queue.Produce(ctx, client, stream, account, amount)
		}
		if err != nil {
			return err
		}
		sum += amount
	}
	log.Info("produced", "stream", stream, "n", n, "sum", sum)
	return nil
}

// stopHook parses QUEUED_TEST_STOP.
func stopHook(spec string, log *slog.Logger) (func(queue.Point, queue.Message, fence.Token), error) {
	if spec == "" {
		return nil, nil
	}
	point, nth, ok := strings.Cut(spec, ":")
	n, err := strconv.Atoi(nth)
	if !ok || err != nil || n <= 0 || (point != queue.BeforeFence.String() && point != queue.BeforeCommit.String()) {
		return nil, fmt.Errorf("%s=%q: want before-fence:<n> or before-commit:<n>", StopEnv, spec)
	}
	seen := 0
	return func(p queue.Point, m queue.Message, token fence.Token) {
		if p.String() != point {
			return
		}
		if seen++; seen != n {
			return
		}
		log.Info("stop", "point", point, "id", m.ID, "token", int64(token), "pid", os.Getpid())
		if err := child.StopSelf(); err != nil {
			log.Error("stop", "err", err)
		}
		log.Info("continued", "id", m.ID, "token", int64(token))
	}, nil
}

func envOr(getenv func(string) string, key, def string) string {
	if v := getenv(key); v != "" {
		return v
	}
	return def
}

// secret is a flag value that may hold a password. Its String, which -h
// prints as the default and errors quote, hides the password.
type secret string

func (s *secret) Set(v string) error { *s = secret(v); return nil }

func (s secret) String() string { return redact(string(s)) }

var passwordParam = regexp.MustCompile(`(?i)(password=)[^&\s]*`)

// redact hides the password of a URL (user:password@ or ?password=).
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(a URL that does not parse, not shown)"
	}
	return passwordParam.ReplaceAllString(u.Redacted(), "${1}xxxxx")
}
