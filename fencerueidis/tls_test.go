package fencerueidis_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// tlsClient is a rueidis client over TLS to srv, closed in t.Cleanup.
func tlsClient(t testing.TB, srv *redistest.Server) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, TLSConfig: srv.TLSConfig()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestTLSConformance runs the suite on rueidis clients over TLS to a
// redis-server that speaks TLS alone, with a TLS replica, so that every
// acquisition and renewal also waits for its acknowledgement.
func TestTLSConformance(t *testing.T) {
	primary := redistest.StartTLS(t, redistest.NewTLS(t))
	redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	fencetest.Run(t, fencetest.Config{
		// A take answered past its deadline gives no lease (MinTTL leaves
		// 7.9 ms): Acquire may refuse a lease of MinTTL.
		ShortLeaseMayFail: true,
		New:               func(t testing.TB) fence.Locker { return newLocker(t, tlsClient(t, primary), redislock.Options{}) },
		Remove:            func(t testing.TB, name string) { admin.Del(context.Background(), lockKey(name)) },
		NewLogged: func(t testing.TB, log *slog.Logger) fence.Locker {
			return newLocker(t, tlsClient(t, primary), redislock.Options{Logger: log})
		},
		NewClosable: func(t testing.TB) (fence.Locker, func()) {
			c := tlsClient(t, primary)
			return newLocker(t, c, redislock.Options{}), c.Close
		},
		WatchdogTTL: watchdogTTL,
	})
}
