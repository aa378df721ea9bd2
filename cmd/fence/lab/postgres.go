package lab

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/pgtest/pgserver"
)

// rowPostgres is the protected row whose resource is PostgreSQL instead of
// SQLite: the same payment row and log table, written by the workers with
// guard.Tx over pgx's database/sql driver.
const rowPostgres = "PostgreSQL"

// postgresServer starts one PostgreSQL server (pgserver: initdb and postgres
// in a temp dir, about 1.5 s) the first time a run needs it, and gives each
// run a fresh database on it.
type postgresServer struct {
	once    sync.Once
	srv     *pgserver.Server
	err     error
	started time.Duration
}

func (p *postgresServer) start() (*pgserver.Server, error) {
	p.once.Do(func() {
		t0 := time.Now()
		p.srv, p.err = pgserver.Start()
		p.started = time.Since(t0)
		if p.err != nil {
			p.err = fmt.Errorf("the PostgreSQL row needs PostgreSQL: %w", p.err)
		}
	})
	return p.srv, p.err
}

// database creates a fresh database and returns its connection string.
func (p *postgresServer) database(ctx context.Context) (string, error) {
	srv, err := p.start()
	if err != nil {
		return "", err
	}
	name, err := srv.CreateDatabase(ctx, "lab")
	if err != nil {
		return "", err
	}
	return srv.DSN(name), nil
}

func (p *postgresServer) close() {
	if p.srv != nil {
		p.srv.Close()
	}
}

// retried counts the writes that guard returned ErrRetry for (a
// serialization failure or deadlock): the worker gave up that lease's
// write, as for a stale token, and took a new lease.
func retried(events []Event) int {
	n := 0
	for _, e := range events {
		if e.Kind == "write" && e.Phase == "fail" && strings.Contains(e.Err, guard.ErrRetry.Error()) {
			n++
		}
	}
	return n
}
