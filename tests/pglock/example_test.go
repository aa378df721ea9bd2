package pglock_test

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/pglock"
)

// A Locker on the caller's *sql.DB (here pgx's stdlib driver), with a
// Listener on pgx (see the package doc) so that waiters wake on a release.
func Example() {
	ctx := context.Background()
	dbName, _ := pg.CreateDatabase(ctx, "example")
	dsn := pg.DSN(dbName)
	db, _ := sql.Open("pgx", dsn)
	defer db.Close()

	locker, err := pglock.New(db, &pglock.Options{Listener: pgxListener{dsn}})
	if err != nil {
		panic(err)
	}
	if err := locker.EnsureSchema(ctx); err != nil {
		panic(err)
	}
	err = fence.Run(ctx, locker, "payment:1001", func(ctx context.Context, lease fence.Lease) error {
		fmt.Println("holding", lease.Name(), "with a token:", lease.Token() > 0)
		return nil // write with lease.Token(); stop when ctx is done
	}, fence.Wait(5*time.Second))
	fmt.Println("err:", err)
	// Output:
	// holding payment:1001 with a token: true
	// err: <nil>
}
