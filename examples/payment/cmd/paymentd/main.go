// Command paymentd serves the payment approval example over HTTP, against
// Redis (the lock) and PostgreSQL or SQLite (the payments).
//
//	go run ./examples/payment/cmd/paymentd -redis redis://127.0.0.1:6379 -db 'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'
//	curl -X POST -H 'X-Approver: alice' localhost:8080/payments/1001/approve
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fencekit/fence/examples/payment"
	"github.com/fencekit/fence/redislock"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"
)

func main() {
	redisURL := flag.String("redis", envOr("FENCE_REDIS_URL", "redis://127.0.0.1:6379"), "Redis URL for the lock (env FENCE_REDIS_URL)")
	dsn := flag.String("db", envOr("PAYMENT_DB", "file:payments.db"), "postgres:// URL or SQLite file: DSN for the payments (env PAYMENT_DB)")
	listen := flag.String("listen", "127.0.0.1:8080", "address to serve on")
	seed := flag.Int64("seed", 1001, "insert this pending payment (amount 5000) if it is missing; 0 inserts none")
	flag.Parse()
	if err := run(*redisURL, *dsn, *listen, *seed); err != nil {
		log.Fatal(err)
	}
}

func run(redisURL, dsn, listen string, seed int64) error {
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return err
	}
	client := redis.NewClient(opt)
	defer client.Close()
	locker, err := redislock.New(client, nil)
	if err != nil {
		return err
	}
	driver := "sqlite"
	if strings.HasPrefix(dsn, "postgres") {
		driver = "pgx"
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := payment.CreateSchema(ctx, db); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	if seed != 0 {
		if _, err := payment.Get(ctx, db, seed); errors.Is(err, payment.ErrNotFound) {
			if err := payment.Insert(ctx, db, seed, 5000); err != nil {
				return err
			}
		}
	}
	svc := &payment.Service{Locker: locker, DB: db}
	srv := &http.Server{Addr: listen, Handler: svc.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	log.Printf("paymentd: serving on http://%s (POST /payments/{id}/approve, GET /payments/{id})", listen)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
