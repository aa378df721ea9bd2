// Command paymentd serves the payment approval example over HTTP, against
// Redis (the lock) and PostgreSQL or SQLite (the payments).
//
//	go run ./examples/payment/cmd/paymentd -redis redis://127.0.0.1:6379 -db 'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'
//	curl -X POST -H 'X-Approver: alice' localhost:8080/payments/1001/approve
//
// -metrics 127.0.0.1:9090 serves Prometheus metrics (fence_* from the
// fenceprom adapter, and the Go runtime's) at /metrics on that address, and
// logs lost leases, failed renewals and replica-sync refusals.
//
// -db takes a postgres:// URL, or the path of a SQLite file, opened with
// guard.SQLiteDSN (WAL, busy timeout, BEGIN IMMEDIATE); a file: DSN is used
// as it is; an in-memory database is refused. At start paymentd waits at
// most 30 s for the database to create the schema. -h shows the
// defaults taken from the environment with their passwords hidden.
//
// SIGINT or SIGTERM stops paymentd taking requests; it exits once the
// approvals in flight have answered (at most LockWait + LockLease + 3 s).
// A second signal ends it at once.
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
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/examples/payment"
	"github.com/fencekit/fence/fenceprom"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/redislock"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"
)

type config struct {
	redis, db secret
	listen    string
	metrics   string
	seed      int64

	// listening, if set, is called with the address served on, once the
	// listener is open (tests listen on port 0).
	listening func(addr string)
	// startTimeout bounds creating the schema and the seed; zero means
	// defaultStartTimeout.
	startTimeout time.Duration
}

// defaultStartTimeout is how long paymentd waits at start for its
// database: one that accepts connections and never answers would
// otherwise hold it there until a signal.
const defaultStartTimeout = 30 * time.Second

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		// The first signal starts the shutdown, which waits for the
		// approvals in flight; a second one ends paymentd at once.
		context.AfterFunc(ctx, stop)
		err = run(ctx, cfg)
		stop()
	}
	if err != nil {
		slog.Error("paymentd", "err", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, getenv func(string) string, out io.Writer) (config, error) {
	fs := flag.NewFlagSet("paymentd", flag.ContinueOnError)
	fs.SetOutput(out)
	cfg := config{redis: secret(envOr(getenv, "FENCE_REDIS_URL", "redis://127.0.0.1:6379")), db: secret(envOr(getenv, "PAYMENT_DB", "payments.db"))}
	fs.Var(&cfg.redis, "redis", "Redis URL for the lock (env FENCE_REDIS_URL)")
	fs.Var(&cfg.db, "db", "postgres:// URL, or SQLite file path, for the payments (env PAYMENT_DB)")
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:8080", "address to serve on")
	fs.StringVar(&cfg.metrics, "metrics", "", "address to serve Prometheus /metrics on; empty serves none")
	fs.Int64Var(&cfg.seed, "seed", 1001, "insert this pending payment (amount 5000) if it is missing; 0 inserts none")
	return cfg, fs.Parse(args)
}

// shutdownGrace is how long run waits, once ctx is done, for the approvals
// in flight: one may wait LockWait for the lock, then hold it LockLease.
// Cut short, the client would not learn whether its payment was approved.
const shutdownGrace = payment.LockWait + payment.LockLease + 3*time.Second

// run serves until ctx is done, then stops taking requests and returns once
// the approvals in flight have answered (or shutdownGrace has passed).
func run(ctx context.Context, cfg config) error {
	opt, err := redis.ParseURL(string(cfg.redis))
	if err != nil {
		// The parse error quotes the URL, password and all.
		return fmt.Errorf("-redis: cannot parse %s", cfg.redis)
	}
	client := redis.NewClient(opt)
	defer client.Close()
	var lockOpts redislock.Options
	var metrics *http.Server
	if cfg.metrics != "" {
		obs, h, err := newMetrics()
		if err != nil {
			return err
		}
		lockOpts.Observer, lockOpts.Logger = obs, slog.Default()
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", h)
		metrics = &http.Server{Addr: cfg.metrics, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	}
	locker, err := redislock.New(client, &lockOpts)
	if err != nil {
		return err
	}
	driver, dsn := "sqlite", guard.SQLiteDSN(string(cfg.db))
	switch {
	case strings.HasPrefix(string(cfg.db), "postgres://"), strings.HasPrefix(string(cfg.db), "postgresql://"):
		driver, dsn = "pgx", string(cfg.db)
	case strings.HasPrefix(string(cfg.db), "file:"):
		dsn = string(cfg.db) // the caller's own SQLite DSN, settings and all
	}
	if driver == "sqlite" && (strings.Contains(dsn, ":memory:") || strings.Contains(dsn, "mode=memory")) {
		// Each pooled connection would open a database of its own, empty
		// but for the one the schema was created on; a shared cache does
		// not suit fenced transactions (see guard.SQLiteDSN).
		return fmt.Errorf("-db %s: an in-memory SQLite database cannot serve approvals; give a file", cfg.db)
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return fmt.Errorf("-db %s: %w", cfg.db, err)
	}
	defer db.Close()
	startCtx, cancelStart := context.WithTimeout(ctx, cmp.Or(cfg.startTimeout, defaultStartTimeout))
	defer cancelStart()
	if err := payment.CreateSchema(startCtx, db); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	if cfg.seed != 0 {
		// Several paymentd may start at once: a payment another one has
		// just inserted is not an error.
		if _, err := db.ExecContext(startCtx, `INSERT INTO payment (id, amount) VALUES ($1, 5000) ON CONFLICT (id) DO NOTHING`, cfg.seed); err != nil {
			return fmt.Errorf("-seed %d: %w", cfg.seed, err)
		}
	}
	svc := &payment.Service{Locker: locker, DB: db}
	srv := &http.Server{Addr: cfg.listen, Handler: svc.Handler(), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	defer ln.Close() // if Serve never runs
	var metricsLn net.Listener
	if metrics != nil {
		if metricsLn, err = net.Listen("tcp", cfg.metrics); err != nil {
			return fmt.Errorf("-metrics: %w", err)
		}
		go func() { _ = metrics.Serve(metricsLn) }()
		slog.Info("paymentd: serving metrics", "addr", "http://"+metricsLn.Addr().String()+"/metrics")
	}
	// Serve returns as soon as Shutdown begins, before the approvals in
	// flight have answered; run returns only once Shutdown has, so that
	// main does not exit (closing the database) under them.
	served := make(chan struct{})
	shutdown := make(chan error, 1)
	go func() {
		select {
		case <-ctx.Done():
		case <-served: // Serve failed by itself
		}
		shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
		defer cancel()
		err := srv.Shutdown(shut)
		if metrics != nil {
			_ = metrics.Shutdown(shut)
		}
		shutdown <- err
	}()
	slog.Info("paymentd: serving (POST /payments/{id}/approve, GET /payments/{id})", "addr", "http://"+ln.Addr().String())
	if cfg.listening != nil {
		cfg.listening(ln.Addr().String())
	}
	err = srv.Serve(ln)
	close(served)
	shutErr := <-shutdown
	switch {
	case !errors.Is(err, http.ErrServerClosed):
		return err
	case shutErr != nil:
		return fmt.Errorf("shutdown: approvals still in flight after %v: %w", shutdownGrace, shutErr)
	}
	return nil
}

// newMetrics returns an Observer counting into a registry of its own (with
// the Go runtime's and the process's collectors) and the handler that
// serves the registry.
func newMetrics() (fence.Observer, http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	obs, err := fenceprom.New(reg, nil)
	if err != nil {
		return nil, nil, err
	}
	return obs, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
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

// redact hides the password of a URL (user:password@ or ?password=) or of
// a key=value connection string (password=…).
func redact(s string) string {
	if !strings.Contains(s, "://") {
		return passwordParam.ReplaceAllString(s, "${1}xxxxx")
	}
	u, err := url.Parse(s)
	if err != nil {
		return "(a URL that does not parse, not shown)"
	}
	return passwordParam.ReplaceAllString(u.Redacted(), "${1}xxxxx")
}
