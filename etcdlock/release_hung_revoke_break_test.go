package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// A Release whose delete is answered and whose revoke then hangs: the
// lease's key was deleted by hand (a lease of fence.TTL whose watch hears
// nothing does not know), so the delete finds nothing, the lease is lost,
// and Release revokes its etcd lease, which the member then holds. The
// revoke ran for cleanupTimeout (500 ms) whatever was left of the caller's
// ctx: a Release with 200 ms returned 0.3 s past its deadline. It must
// return by its deadline (and doneGrace), and the revoke still get
// through once the member answers (retried in the background).
func TestReleaseRevokeHungWithinDeadline(t *testing.T) {
	l, g := deafHungLocker(t)
	admin := newClient(t, shared.Endpoints(), nil)
	lease := acquire(t, l, t.Name(), time.Minute)
	id := leaseID(t, lease)
	over, err := releaseKeyDeleted(t, admin, g, lease)
	t.Logf("Release = %v, %v past its ctx's deadline", err, over.Round(time.Millisecond))
	if !errors.Is(err, fence.ErrLeaseLost) {
		t.Errorf("Release of a lease whose key was deleted = %v, want ErrLeaseLost", err)
	}
	if over > extendGrace {
		t.Errorf("Release returned %v past its ctx's deadline, the revoke hung", over.Round(time.Millisecond))
	}
	g.resume()
	waitRevoked(t, admin, id, 5*time.Second)
}

// deafHungLocker returns a Locker on a client of the shared server whose
// watches hear nothing (deafWatchClient), through a hangGate, and the
// gate, resumed in t.Cleanup.
func deafHungLocker(t *testing.T) (*etcdlock.Locker, *hangGate) {
	t.Helper()
	g := &hangGate{}
	t.Cleanup(g.resume)
	l, err := etcdlock.New(deafWatchClient(t, shared.Endpoints(), grpc.WithChainUnaryInterceptor(g.intercept)), nil)
	if err != nil {
		t.Fatal(err)
	}
	return l, g
}

// releaseKeyDeleted deletes lease's key by hand (a lease of fence.TTL
// whose watch hears nothing does not know), hangs the member behind g and
// releases lease with a ctx of 200 ms: the delete finds nothing, the lease
// is lost, and Release revokes its etcd lease, which the member holds. It
// returns how long past its ctx's deadline Release returned, and its
// error.
func releaseKeyDeleted(t *testing.T, admin *clientv3.Client, g *hangGate, lease fence.Lease) (over time.Duration, err error) {
	t.Helper()
	if _, err := admin.Delete(ctxFor(t, 10*time.Second), lease.(*etcdlock.Lease).Key()); err != nil {
		t.Fatal(err)
	}
	g.hang() // Txn and LeaseRevoke; the delete (DeleteRange) is answered
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	dl, _ := ctx.Deadline()
	err = lease.Release(ctx)
	return time.Since(dl), err
}

// waitRevoked waits, up to limit, for etcd to no longer know the etcd
// lease id (revoked, or expired).
func waitRevoked(t *testing.T, admin *clientv3.Client, id clientv3.LeaseID, limit time.Duration) {
	t.Helper()
	for end := time.Now().Add(limit); ; {
		resp, err := admin.TimeToLive(ctxFor(t, 5*time.Second), id)
		if err != nil {
			t.Fatal(err)
		}
		if resp.TTL == -1 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("etcd lease %x still has %d s left %v after the member answered again", int64(id), resp.TTL, limit)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}
