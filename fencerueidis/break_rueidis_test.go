package fencerueidis_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/fencerueidis"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/rueidis"
)

// Scenarios redislock's tests cover on go-redis, run here on rueidis.

// TestTinyConnWriteTimeoutSync: as redislock's
// TestSyncTimeoutWithinReadTimeout, on rueidis. A client made with a
// ConnWriteTimeout shorter than replica sync's timeout, on a primary whose
// replica is paused: WAIT blocks for the whole sync timeout. The
// acquisition must be refused with ErrNotReplicated (or New must refuse the
// options), not fail with a connection error, and must leave nothing held.
func TestTinyConnWriteTimeoutSync(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{primary.Addr}, ConnWriteTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	l, err := fencerueidisNew(c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Replicas: 1, Timeout: time.Second}})
	if errors.Is(err, fence.ErrInvalidOption) {
		t.Logf("New refused: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	resume := replica.Pause(t)
	start := time.Now()
	_, err = l.Acquire(ctx(t), "tiny", fence.TTL(time.Minute))
	t.Logf("Acquire with the replica paused: %v after %v", err, time.Since(start).Round(time.Millisecond))
	if !errors.Is(err, fence.ErrNotReplicated) {
		t.Errorf("Acquire = %v, want ErrNotReplicated", err)
	}
	resume()
	awaitGone(t, admin, "tiny", 5*time.Second, "the refused acquisition's lock")
	lease, err := l.Acquire(ctx(t), "tiny", fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire with the replica back: %v", err)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

func fencerueidisNew(c rueidis.Client, o redislock.Options) (*redislock.Locker, error) {
	if o.WatchdogTTL == 0 {
		o.WatchdogTTL = watchdogTTL
	}
	return fencerueidis.New(c, &o)
}

// dialCounter is a rueidis dialer that counts failed dials.
type dialCounter struct{ failed atomic.Int64 }

func (d *dialCounter) dial(ctx context.Context, addr string, nd *net.Dialer, _ *tls.Config) (net.Conn, error) {
	c, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		d.failed.Add(1)
	}
	return c, err
}

// TestWaitRidesOutRestart: as redislock's test of that name, on rueidis. A
// server killed and restarted on the same port while two callers wait does
// not end their waits: they take the lock once it is back, with tokens
// larger than the holder's.
func TestWaitRidesOutRestart(t *testing.T) {
	for _, resp2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "resp3", true: "resp2"}[resp2], func(t *testing.T) { waitRidesOutRestart(t, resp2) })
	}
}

func waitRidesOutRestart(t *testing.T, resp2 bool) {
	srv := redistest.Start(t)
	const name = "lock:payment:1001"
	holderL := newLocker(t, client(t, srv.Addr), redislock.Options{})
	holder, err := holderL.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var d dialCounter
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DialCtxFn: d.dial, AlwaysRESP2: resp2, DisableCache: resp2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	l := newLocker(t, c, redislock.Options{})
	var wg sync.WaitGroup
	tokens := make([]fence.Token, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() {
			lease, err := l.Acquire(ctx(t), name, fence.Wait(20*time.Second), fence.TTL(time.Minute))
			if err != nil {
				errs[i] = err
				return
			}
			tokens[i] = lease.Token()
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			errs[i] = lease.Release(rctx)
		})
	}
	admin := srv.Client(t)
	ch := lockKey(name) + ":released"
	waitFor(t, func() bool { return admin.PubSubNumSub(ctx(t), ch).Val()[ch] >= 1 })
	srv.Kill()
	waitFor(t, func() bool { return d.failed.Load() >= 3 })
	if err := srv.Relaunch(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	t.Logf("failed dials while down: %d; tokens %v", d.failed.Load(), tokens)
	for i, err := range errs {
		if err != nil {
			t.Errorf("waiter %d: %v", i, err)
		} else if tokens[i] <= holder.Token() {
			t.Errorf("waiter %d: token %d after %d", i, tokens[i], holder.Token())
		}
	}
	if tokens[0] == tokens[1] {
		t.Errorf("both waiters got token %d", tokens[0])
	}
}

// TestPermanentErrorsEndWait: as redislock's TestPermanentErrorEndsWait and
// TestACLErrorEndsWait, on rueidis: WRONGTYPE and NOPERM end a 10 s wait at
// once.
func TestPermanentErrorsEndWait(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	const name = "lock:payment:1001"
	if err := admin.HSet(ctx(t), lockKey(name)+":token", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	check := func(l *redislock.Locker, name, code string) {
		t.Helper()
		start := time.Now()
		_, err := l.Acquire(ctx(t), name, fence.Wait(10*time.Second))
		if !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), code) {
			t.Errorf("Acquire = %v, want ErrNotAcquired with %s", err, code)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("%s took %v to end the wait", code, took)
		}
	}
	check(newLocker(t, client(t, srv.Addr), redislock.Options{}), name, "WRONGTYPE")
	if err := admin.Do(ctx(t), "ACL", "SETUSER", "app", "on", ">pw", "~other:*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, Username: "app", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	check(newLocker(t, c, redislock.Options{}), "lock:other", "NOPERM")
}

// TestBadTokenRecord: as redislock's TestTokenRecordOutsideExactRange, on
// rueidis: a record the script refuses gives ErrBadTokenRecord naming the
// key, nothing locked, the record unchanged.
func TestBadTokenRecord(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	l := newLocker(t, client(t, srv.Addr), redislock.Options{})
	const name = "lock:payment:1001"
	record := lockKey(name) + ":token"
	for _, bad := range []string{"9007199254740993", "abc", "-5"} {
		if err := admin.Set(ctx(t), record, bad, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		_, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute), fence.Wait(time.Second))
		if !errors.Is(err, redislock.ErrBadTokenRecord) || !errors.Is(err, fence.ErrNotAcquired) || !strings.Contains(err.Error(), record) {
			t.Fatalf("record %q: Acquire = %v, want ErrBadTokenRecord naming %s", bad, err, record)
		}
		if admin.Exists(ctx(t), lockKey(name)).Val() != 0 {
			t.Fatalf("record %q: the lock is held", bad)
		}
		if got := admin.Get(ctx(t), record).Val(); got != bad {
			t.Fatalf("record %q changed to %q", bad, got)
		}
	}
	// Evicted (deleted): the clock floor keeps the next token above.
	admin.Set(ctx(t), record, "100", 0)
	first, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	admin.Del(ctx(t), record)
	lease, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if lease.Token() <= first.Token() {
		t.Fatalf("after the record's eviction token %d, want > %d", lease.Token(), first.Token())
	}
	st, err := l.Status(ctx(t), name)
	if err != nil || !st.Held || st.LastToken != lease.Token() {
		t.Fatalf("Status = %+v, %v", st, err)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

// TestReplicaCutFreshLocker: as redislock's
// TestReplicaCutFreshAndOldLockers, on rueidis: once a replica has been
// seen, a Locker of a fresh client (a new process) made after the replica
// was cut does not get the lock without that replica's acknowledgement;
// Status and ReplicaCounts say 1 expected, 0 connected; after
// SetExpectedReplicas(0) it acquires at once.
func TestReplicaCutFreshLocker(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	admin := primary.Client(t)
	sync := redislock.ReplicaSync{Timeout: 200 * time.Millisecond}
	old := newLocker(t, client(t, primary.Addr), redislock.Options{ReplicaSync: sync})
	warm, err := old.Acquire(ctx(t), "warm-up", fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	redistest.CutLink(t, primary, replica)
	fresh := newLocker(t, client(t, primary.Addr), redislock.Options{ReplicaSync: sync})
	_, err = fresh.Acquire(ctx(t), "job", fence.TTL(time.Minute))
	var nr *fence.NotReplicatedError
	if !errors.As(err, &nr) || nr.Acked != 0 || nr.Required != 1 {
		t.Fatalf("fresh Locker after the cut: Acquire = %v, want ErrNotReplicated 0 of 1", err)
	}
	if admin.Exists(ctx(t), lockKey("job")).Val() != 0 {
		t.Fatal("the refused acquisition left the lock held")
	}
	s, err := fresh.Status(ctx(t), "job")
	if err != nil || s.Replicas.Expected != 1 || s.Replicas.Connected != 0 || s.Replicas.ReplicationID == "" {
		t.Fatalf("Status = %+v, %v; want 1 expected, 0 connected", s, err)
	}
	rc, err := fresh.ReplicaCounts(ctx(t), "job")
	if err != nil || rc.Expected != 1 || rc.Connected != 0 {
		t.Fatalf("ReplicaCounts = %+v, %v", rc, err)
	}
	if err := fresh.SetExpectedReplicas(ctx(t), "job", 0); err != nil {
		t.Fatal(err)
	}
	// Had it waited for the replica, whose link is cut, the wait would
	// have failed it (ErrNotReplicated after the 200 ms timeout).
	lease, err := fresh.Acquire(ctx(t), "job", fence.TTL(time.Minute))
	if err != nil {
		t.Fatalf("after SetExpectedReplicas(0): %v", err)
	}
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}
