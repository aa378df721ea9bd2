package fence_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/memlock"
	"github.com/fencekit/fence/pglock"
	"github.com/fencekit/fence/redislock"
	"github.com/fencekit/fence/redlock"
	"github.com/redis/go-redis/v9"
)

// countingObserver is an Observer of the caller's own, given as a nil
// pointer: the nil *fenceprom.Observer of a fenceprom.New whose error was
// ignored is the same.
type countingObserver struct {
	fence.NopObserver
	n int
}

func (o *countingObserver) AcquireDone(fence.AcquireEvent) { o.n++ }

// TestNilObserverRefused: an Options.Observer holding a nil pointer is not
// a nil Observer. Before, every New accepted it and the first Acquire
// panicked in AcquireDone (memlock's and redislock's inside Acquire, a
// lease's end in a goroutine of the backend's, where no recover of the
// caller's can catch it). Now New refuses it with ErrInvalidOption naming
// the type; a nil Observer and a non-nil one are still accepted.
func TestNilObserverRefused(t *testing.T) {
	var nilObs *countingObserver
	clients := make([]redis.UniversalClient, 3)
	for i := range clients {
		clients[i] = redistest.Start(t).Client(t)
	}
	db := sql.OpenDB(unusedConnector{})
	t.Cleanup(func() { _ = db.Close() })
	news := map[string]func(fence.Observer) (fence.Locker, error){
		"memlock": func(o fence.Observer) (fence.Locker, error) {
			return memlock.New(&memlock.Options{Observer: o})
		},
		"redislock": func(o fence.Observer) (fence.Locker, error) {
			return redislock.New(clients[0], &redislock.Options{Observer: o})
		},
		"redlock": func(o fence.Observer) (fence.Locker, error) {
			return redlock.New(clients, &redlock.Options{Observer: o})
		},
		"pglock": func(o fence.Observer) (fence.Locker, error) {
			return pglock.New(db, &pglock.Options{Observer: o})
		},
	}
	for backend, newLocker := range news {
		l, err := newLocker(nilObs)
		if !errors.Is(err, fence.ErrInvalidOption) {
			if l != nil && backend != "pglock" {
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Errorf("%s: Acquire panicked: %v", backend, r)
						}
					}()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					if lease, err := l.Acquire(ctx, "lock:payment:1001"); err == nil {
						_ = lease.Release(ctx)
					}
				}()
			}
			t.Errorf("%s: New with a nil *countingObserver = %v; want ErrInvalidOption", backend, err)
		}
		for _, o := range []fence.Observer{nil, &countingObserver{}, fence.NopObserver{}} {
			if _, err := newLocker(o); err != nil {
				t.Errorf("%s: New with Observer %#v = %v; want it accepted", backend, o, err)
			}
		}
	}
}

// unusedConnector makes a *sql.DB for pglock.New, which does not connect.
type unusedConnector struct{}

func (unusedConnector) Connect(context.Context) (driver.Conn, error) {
	return nil, errors.New("unusedConnector: not for connecting")
}
func (unusedConnector) Driver() driver.Driver { return nil }
