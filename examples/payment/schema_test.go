package payment_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/fencekit/fence/examples/payment"
)

// Workers started at once (two paymentd, as the README runs them) each
// create the schema: PostgreSQL's CREATE TABLE IF NOT EXISTS fails, rather
// than finds the table, when a concurrent one creates it first. None may
// fail to start on that.
func TestCreateSchemaConcurrently(t *testing.T) {
	for round := range 5 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			db := pg.NewDB(t)
			const workers = 8
			db.SetMaxOpenConns(workers)
			start := make(chan struct{})
			errs := make([]error, workers)
			var wg sync.WaitGroup
			for i := range workers {
				wg.Go(func() {
					<-start
					errs[i] = payment.CreateSchema(ctx(t), db)
				})
			}
			close(start)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("worker %d: CreateSchema on a fresh database, %d at once: %v", i, workers, err)
				}
			}
		})
	}
}
