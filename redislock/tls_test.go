package redislock_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencetest"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/internal/silent"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// tlsClient is a go-redis client over TLS to srv, closed in t.Cleanup.
func tlsClient(t testing.TB, srv *redistest.Server) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, TLSConfig: srv.TLSConfig()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestTLSConformance runs the conformance suite on a go-redis client over
// TLS to a redis-server that speaks TLS alone (--port 0).
func TestTLSConformance(t *testing.T) {
	t.Parallel() // own server; the suite mostly waits on leases
	srv := redistest.StartTLS(t, redistest.NewTLS(t))
	admin := srv.Client(t)
	plain := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = plain.Close() })
	if err := plain.Ping(ctx(t)).Err(); err == nil {
		t.Fatal("a plain TCP client got an answer: the server does not speak TLS alone")
	}
	fencetest.Run(t, fencetest.Config{
		// A take answered past its deadline gives no lease (MinTTL leaves
		// 7.9 ms): Acquire may refuse a lease of MinTTL.
		ShortLeaseMayFail: true,
		New: func(t testing.TB) fence.Locker {
			return newLockerWith(t, tlsClient(t, srv), redislock.Options{WatchdogTTL: conformanceWatchdogTTL})
		},
		Remove: func(t testing.TB, name string) { admin.Del(context.Background(), lockKey(name)) },
		NewObserved: func(t testing.TB, obs fence.Observer) fence.Locker {
			return newLockerWith(t, tlsClient(t, srv), redislock.Options{Observer: obs, WatchdogTTL: conformanceWatchdogTTL})
		},
		NewLogged: func(t testing.TB, log *slog.Logger) fence.Locker {
			return newLockerWith(t, tlsClient(t, srv), redislock.Options{Logger: log, WatchdogTTL: conformanceWatchdogTTL})
		},
		NewClosable: func(t testing.TB) (fence.Locker, func()) {
			c := tlsClient(t, srv)
			return newLockerWith(t, c, redislock.Options{WatchdogTTL: conformanceWatchdogTTL}), func() { _ = c.Close() }
		},
		WatchdogTTL: conformanceWatchdogTTL,
	})
}

// TestTLSReplicaSync: a primary and a replica that replicates over TLS
// (--tls-replication yes). The replica's acknowledgements are counted (an
// AcksAll acquisition succeeds and the record expects one replica), and
// with its link cut an acquisition is refused with ErrNotReplicated 0 of 1,
// leaving nothing locked.
func TestTLSReplicaSync(t *testing.T) {
	t.Parallel() // own servers; waits on WAIT timeouts
	primary := redistest.StartTLS(t, redistest.NewTLS(t))
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	l := lockerWith(t, tlsClient(t, primary), redislock.Options{ReplicaSync: redislock.ReplicaSync{Acks: redislock.AcksAll}})
	lease := acquire(t, l, "lock:payment:1001", fence.TTL(30*time.Second))
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	counts, err := l.ReplicaCounts(ctx(t), "lock:payment:1001")
	if err != nil || counts.Expected != 1 || counts.Connected != 1 {
		t.Fatalf("ReplicaCounts = %+v, %v; want 1 expected, 1 connected", counts, err)
	}

	redistest.CutLink(t, primary, replica)
	start := time.Now()
	_, err = l.Acquire(ctx(t), "lock:payment:1001", fence.TTL(30*time.Second))
	var nr *fence.NotReplicatedError
	if !errors.As(err, &nr) || nr.Acked != 0 || nr.Required != 1 {
		t.Fatalf("Acquire with the TLS replica cut off = %v, want ErrNotReplicated 0 of 1", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("refusal took %v, want about the 1 s sync timeout", took)
	}
	if n := primary.Client(t).Exists(ctx(t), lockKey("lock:payment:1001")).Val(); n != 0 {
		t.Fatal("refused acquisition left the lock on the primary")
	}
}

// TestTLSBlackHoleReturnsByDeadline: a listener that accepts and never
// answers the TLS handshake (to a TLS client, a silent TCP listener is
// exactly that) must not hold Acquire, Status or a wait past the caller's
// deadline, with go-redis's defaults and with ContextTimeoutEnabled (which
// the README names). The TLS handshake is part of go-redis's dial.
func TestTLSBlackHoleReturnsByDeadline(t *testing.T) {
	ca := redistest.NewTLS(t)
	for _, cte := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", cte), func(t *testing.T) {
			t.Parallel() // each on its own listener, waiting out deadlines
			c := redis.NewClient(&redis.Options{Addr: silent.Addr(t), TLSConfig: ca.ClientConfig(), ContextTimeoutEnabled: cte})
			t.Cleanup(func() { _ = c.Close() })
			l := newLocker(t, c)
			for _, wait := range []time.Duration{0, 10 * time.Second} {
				within(t, fmt.Sprintf("Acquire(Wait %v)", wait), func(ctx context.Context) error {
					_, err := l.Acquire(ctx, "lock:payment:1001", fence.Wait(wait))
					if err != nil && !errors.Is(err, fence.ErrNotAcquired) {
						t.Errorf("Acquire = %v, want ErrNotAcquired", err)
					}
					return err
				})
			}
			within(t, "Status", func(ctx context.Context) error { _, err := l.Status(ctx, "lock:payment:1001"); return err })
			within(t, "ReplicaCounts", func(ctx context.Context) error { _, err := l.ReplicaCounts(ctx, "lock:payment:1001"); return err })
		})
	}
}

// TestTLSClientCertificateRefusalEndsWait: a server that requires client
// certificates (--tls-auth-clients yes) refuses a client without one with a
// TLS alert on its first read. That is the server's answer, as an auth
// error is: a waiting Acquire must end at once with it, not retry it until
// its wait budget runs out.
func TestTLSClientCertificateRefusalEndsWait(t *testing.T) {
	t.Parallel()
	ca := redistest.NewTLS(t)
	srv := redistest.StartTLS(t, ca, "--tls-auth-clients", "yes")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, TLSConfig: &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}})
	t.Cleanup(func() { _ = c.Close() })
	l := newLocker(t, c)
	start := time.Now()
	_, err := l.Acquire(ctx(t), "lock:payment:1001", fence.Wait(10*time.Second))
	took := time.Since(start)
	t.Logf("Acquire: %v after %v", err, took)
	if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("Acquire without the client certificate the server requires = %v, want ErrNotAcquired naming it", err)
	}
	if took > 3*time.Second {
		t.Fatalf("Acquire(Wait 10s) refused by the server's TLS alert returned after %v, want at once", took)
	}
}

// TestTLSSentinelFailover: a TLS primary, a TLS replica and three TLS
// sentinels; go-redis failover clients with a TLSConfig. A lock confirmed by
// the replica (AcksAll) survives the primary's crash: once the sentinels
// promote the replica, another client is refused (ErrHeld) there, the
// holder releases it there, and the next token is larger.
func TestTLSSentinelFailover(t *testing.T) {
	t.Parallel() // own servers; mostly waits out the failover
	ca := redistest.NewTLS(t)
	primary := redistest.StartTLS(t, ca)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	sentinels := redistest.StartSentinels(t, primary, 3)
	redistest.WaitSentinelsReady(t, sentinels, 1)
	newClient := func() *redis.Client {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinels.Master, SentinelAddrs: sentinels.Addrs(), TLSConfig: ca.ClientConfig()})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	sync := redislock.ReplicaSync{Acks: redislock.AcksAll}
	holder := lockerWith(t, newClient(), redislock.Options{ReplicaSync: sync})
	other := lockerWith(t, newClient(), redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	lease := acquire(t, holder, "lock:payment:1001", fence.TTL(time.Minute))

	primary.Kill()
	promoted := redistest.WaitFailover(t, sentinels, primary, replica)
	waitFor(t, func() bool {
		_, err := other.Acquire(ctx(t), "lock:payment:1001")
		if err != nil && !errors.Is(err, fence.ErrHeld) {
			t.Logf("Acquire after the failover: %v", err)
		}
		return errors.Is(err, fence.ErrHeld)
	})
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatalf("Release on the promoted %s: %v", promoted.Addr, err)
	}
	next, err := other.Acquire(ctx(t), "lock:payment:1001", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx(t))
	if next.Token() <= lease.Token() {
		t.Fatalf("token after the failover %d is not above %d", next.Token(), lease.Token())
	}
}

// TestTLSWaitRidesOutRestart: a waiting Acquire on a TLS client rides out a
// restart of the TLS server (its subscription and pooled connections
// broken, new TLS handshakes refused while it is down) and takes the lock,
// which the restart (no persistence) freed, well within its budget.
func TestTLSWaitRidesOutRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTLS(t, redistest.NewTLS(t))
	holder := newLocker(t, tlsClient(t, srv))
	waiter := newLocker(t, tlsClient(t, srv))
	acquire(t, holder, "lock:payment:1001", fence.TTL(time.Minute))
	got := make(chan error, 1)
	go func() {
		lease, err := waiter.Acquire(ctx(t), "lock:payment:1001", fence.Wait(20*time.Second), fence.TTL(time.Minute))
		if err == nil {
			defer lease.Release(context.Background())
		}
		got <- err
	}()
	admin := srv.Client(t)
	waitFor(t, func() bool { return admin.HLen(ctx(t), lockKey("lock:payment:1001")+":waiters").Val() > 0 }) // queued
	start := time.Now()
	srv.Restart(t)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Acquire across the TLS server's restart: %v", err)
		}
		t.Logf("acquired %v after the restart", time.Since(start).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatal("Acquire still waiting 15 s after the TLS server restarted empty")
	}
}
