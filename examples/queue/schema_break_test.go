package queue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence/examples/queue"
)

// TestCreateSchema32AtOnce (branch break-today): 32 consumers start at once
// on a fresh database and each creates the schema (three tables, one with
// an identity column, and the guard's): none may fail.
func TestCreateSchema32AtOnce(t *testing.T) {
	const workers = 32
	for round := range 3 {
		db := pg.NewDB(t)
		db.SetMaxOpenConns(workers)
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, workers)
		for i := range workers {
			wg.Go(func() {
				<-start
				errs[i] = queue.CreateSchema(c, db)
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d consumer %d: %v", round, i, err)
			}
		}
	}
}
