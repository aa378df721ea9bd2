package etcdlock_test

import (
	"context"
	"errors"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	"github.com/fencekit/fence/internal/etcdserver"
	"github.com/fencekit/fence/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
)

// watchPeers records the address of the member each Watch stream of a
// client was opened on.
type watchPeers struct {
	mu    sync.Mutex
	addrs []string
	added chan struct{}
}

func (w *watchPeers) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err == nil && method == "/etcdserverpb.Watch/Watch" {
		if p, ok := peer.FromContext(cs.Context()); ok {
			w.mu.Lock()
			w.addrs = append(w.addrs, p.Addr.String())
			w.mu.Unlock()
			select {
			case w.added <- struct{}{}:
			default:
			}
		}
	}
	return cs, err
}

// last returns the address of the last Watch stream opened.
func (w *watchPeers) last() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.addrs) == 0 {
		return ""
	}
	return w.addrs[len(w.addrs)-1]
}

// memberAt returns the member of c whose client URL is at addr.
func memberAt(t *testing.T, c *etcdserver.Cluster, addr string) *etcdserver.Member {
	t.Helper()
	for _, m := range c.Members {
		u, err := url.Parse(m.ClientURL)
		if err != nil {
			t.Fatal(err)
		}
		if u.Host == addr {
			return m
		}
	}
	t.Fatalf("no member at %s", addr)
	return nil
}

// A holder's watch sits on a member that hangs (paused: its connection
// stays open and answers nothing), while its watchdog renews the etcd lease
// through the others. An operator deletes the key (etcdctl del): the lock
// is free, and another Locker takes it. The holder must learn of it at its
// next renewal at the latest, as a waiter does (it checks its key after
// each renewal), and not keep Err nil for as long as the member hangs:
// two holders at once.
func TestKeyDeletedWhileWatchHangs(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	const ttl = 3 * time.Second
	wp := &watchPeers{added: make(chan struct{}, 1)}
	cl, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(wp.intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	l, err := etcdlock.New(cl, &etcdlock.Options{WatchdogTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 60*time.Second)
	held, err := l.Acquire(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background()) //nolint:errcheck // lost, by design
	select {
	case <-wp.added:
	case <-time.After(10 * time.Second):
		t.Fatal("the lease's key is not watched 10 s after the grant")
	}
	hung := memberAt(t, c, wp.last())
	hung.Stop()
	t.Cleanup(hung.Cont)
	var others []string
	for _, m := range c.Members {
		if m != hung {
			others = append(others, m.ClientURL)
		}
	}
	leader := etcdtest.Leader(t, c, hung)
	t.Logf("the watch is on %s, paused; %s leads", hung.Name, leader.Name)
	admin := newClient(t, others, nil)
	if _, err := admin.Delete(ctx, held.(*etcdlock.Lease).Key()); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	next, err := newLocker(t, others, nil).Acquire(ctx, t.Name(), fence.Wait(10*time.Second))
	if err != nil {
		t.Fatalf("the lock is free, yet: %v", err)
	}
	defer next.Release(context.Background()) //nolint:errcheck // checked below
	select {
	case <-held.Done():
		t.Logf("the deleted lease ended %v after the delete: %v", time.Since(deleted), held.Err())
	case <-time.After(2 * ttl):
		t.Fatalf("two holders: token %d still held (Err %v) %v after its key was deleted and token %d granted",
			held.Token(), held.Err(), time.Since(deleted), next.Token())
	}
	if err := next.Err(); err != nil {
		t.Fatalf("the new holder lost its lease: %v", err)
	}
}

// deafStream is a Watch stream that delivers nothing, as one on a member
// that hangs: RecvMsg waits until the stream's context ends.
type deafStream struct {
	grpc.ClientStream
	ctx context.Context
}

func (s deafStream) RecvMsg(any) error {
	select {
	case <-s.ctx.Done():
	case <-s.ClientStream.Context().Done():
	}
	return context.Canceled
}

// deafWatchClient returns a client of endpoints whose watches deliver
// nothing, closed in t.Cleanup.
func deafWatchClient(t *testing.T, endpoints []string, opts ...grpc.DialOption) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: append(opts, grpc.WithChainStreamInterceptor(
			func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				cs, err := streamer(ctx, desc, cc, method, opts...)
				if err != nil || method != "/etcdserverpb.Watch/Watch" {
					return cs, err
				}
				return deafStream{cs, ctx}, nil
			})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The key of a lease is deleted by hand while the holder's watch delivers
// nothing (see TestKeyDeletedWhileWatchHangs; a lease of fence.TTL has no
// renewal to read it). Its Release then fails (its ctx done) and revokes
// the etcd lease; the Release that retries finds the key gone. The lease
// had been lost before the first Release was called: the retry must not
// vouch for it (nil, "released"), as the first Release's revoke may or may
// not be what deleted the key. Skipped as a design question until the
// failed Release read the key before its revoke (checkGone): the retry
// returned nil.
func TestRetriedReleaseAfterLossNotReleased(t *testing.T) {
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l, err := etcdlock.New(deafWatchClient(t, endpoints), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 30*time.Second)
	lease, err := l.Acquire(ctx, t.Name(), fence.TTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Delete(ctx, lease.(*etcdlock.Lease).Key()); err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := lease.Release(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release with a done ctx = %v, want context.Canceled", err)
	}
	if err := lease.Release(ctx); !errors.Is(err, fence.ErrLeaseLost) {
		t.Fatalf("Release retried after the lease's key was deleted by hand = %v, want ErrLeaseLost", err)
	}
}

// A lease of fence.TTL (nothing renews it) whose watch delivers nothing,
// as one on a member that hangs: its etcd lease is revoked behind its back
// (etcdctl lease revoke), its key goes with it, and another Locker takes
// the lock. Nothing but the watch would tell the holder: it stays held,
// Err nil, until its deadline, a whole lease time of two holders.
func TestRevokedFixedTTLWhileWatchDeaf(t *testing.T) {
	t.Skip("bug: a lease of fence.TTL learns of a revoke or a delete only from its watch, which a member that " +
		"hangs never delivers, so it stays held until its deadline. The watchdog's fix (a read of the key with " +
		"each renewal) has no renewal to ride on here: run would need reads of its own on a timer (at what " +
		"interval? a third of the lease time is still a third of an hour for a lease of an hour), a read per " +
		"lease that a fixed lease never paid for. A design decision; the token still guards the resource.")
	endpoints := shared.Endpoints()
	admin := newClient(t, endpoints, nil)
	l, err := etcdlock.New(deafWatchClient(t, endpoints), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 60*time.Second)
	const ttl = 30 * time.Second
	held, err := l.Acquire(ctx, t.Name(), fence.TTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background()) //nolint:errcheck // lost, by design
	if _, err := admin.Revoke(ctx, leaseID(t, held)); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	next, err := newLocker(t, endpoints, nil).Acquire(ctx, t.Name(), fence.Wait(0))
	if err != nil {
		t.Fatalf("the lock is free, yet: %v", err)
	}
	defer next.Release(context.Background()) //nolint:errcheck // checked below
	select {
	case <-held.Done():
		t.Logf("the revoked lease ended %v after the revoke: %v", time.Since(revoked), held.Err())
	case <-time.After(ttl / 3):
		t.Fatalf("two holders: token %d still held (Err %v) %v after its etcd lease was revoked and token %d granted",
			held.Token(), held.Err(), time.Since(revoked), next.Token())
	}
}
