package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/fencekit/fence/redislock"
	"github.com/redis/go-redis/v9"
)

// refuser refuses the dials to the addresses it is told to.
type refuser struct {
	mu      sync.Mutex
	refused map[string]bool
}

func (r *refuser) set(addr string, refuse bool) { r.mu.Lock(); r.refused[addr] = refuse; r.mu.Unlock() }

func (r *refuser) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	r.mu.Lock()
	refuse := r.refused[addr]
	r.mu.Unlock()
	if refuse {
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// holdsWithin polls cond, as waitFor does, until it holds or d has passed; it
// returns how long that took and whether cond held.
func holdsWithin(d time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Since(start) > d {
			return time.Since(start).Round(time.Millisecond), false
		}
		<-tick.C
	}
	return time.Since(start).Round(time.Millisecond), true
}

// TestParkedGiveBackOnLiveNodeNotStarved: on a cluster, one node (B) stays
// down while the Acquires of the locks it serves keep failing, refused,
// each parking a give-back; another node (A) refuses for a moment, and a
// give-back for a lock on A is parked too. Once A answers, its give-back
// should go out within about a probe's back-off (a second): the lock it
// frees may be held by nobody. The parking probes one give-back at a
// time, rotating through them all, so that A's waits behind every one of
// B's, a second each.
func TestParkedGiveBackOnLiveNodeNotStarved(t *testing.T) {
	rc := startRefusingCluster(t, 0)
	l, admin, nodeOf := rc.l, rc.admin, rc.nodeOf
	// Lock names on two different masters.
	nameA := "lock:starve-a"
	addrA := nodeOf(nameA)
	var namesB []string
	var addrB string
	for i := 0; len(namesB) < 20; i++ {
		name := fmt.Sprintf("lock:starve-b-%d", i)
		if addr := nodeOf(name); addr != addrA && (addrB == "" || addr == addrB) {
			addrB = addr
			namesB = append(namesB, name)
		}
	}
	for _, name := range append([]string{nameA}, namesB...) { // connections, scripts
		if err := acquire(t, l, name, fence.TTL(time.Minute)).Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	rc.refuse(addrB)
	for _, name := range namesB {
		if _, err := l.Acquire(ctx(t), name, fence.TTL(time.Minute)); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("Acquire on the refusing node: %v", err)
		}
	}
	rc.refuse(addrA)
	if _, err := l.Acquire(ctx(t), nameA, fence.TTL(time.Minute)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Acquire on the refusing node: %v", err)
	}
	if got := redislock.Parked(l); got != len(namesB)+1 {
		t.Fatalf("%d parked, want %d", got, len(namesB)+1)
	}
	rc.r.set(addrA, false)
	markA := lockKey(nameA) + ":revoked:*"
	took, ok := holdsWithin(3*time.Second, func() bool { return len(admin.Keys(ctx(t), markA).Val()) > 0 })
	if !ok {
		t.Fatalf("the give-back for a lock on the node that answers again not sent after %v: it waits behind %d parked for the node still down", took, len(namesB))
	}
	t.Logf("A's give-back sent %v after A answered", took)
}

// TestParkedGiveBackNotBehindHungNode: on a cluster, node B refused (its
// give-backs parked, more than are sent at a time), then comes back but
// does not answer for a while: paused here, loading its data set (LOADING)
// in life. Each round's probes, one per server, run at once, and B's
// hangs for up to probeFor (no answer: B's give-backs stay parked; when a
// hung probe counted as one, they went out and held every sending slot
// while B hung). Node A refuses for a moment and answers again: the
// give-back for its lock should go out within about a round, not wait for
// B.
func TestParkedGiveBackNotBehindHungNode(t *testing.T) {
	rc := startRefusingCluster(t, time.Second)
	l, nodeOf := rc.l, rc.nodeOf
	nameA := "lock:hung-a"
	addrA := nodeOf(nameA)
	var nameB, addrB string
	for i := 0; nameB == ""; i++ {
		name := fmt.Sprintf("lock:hung-b-%d", i)
		if addr := nodeOf(name); addr != addrA {
			nameB, addrB = name, addr
		}
	}
	var serverB *redistest.Server
	for _, s := range rc.Servers {
		if s.Addr == addrB {
			serverB = s
		}
	}
	if serverB == nil {
		t.Fatalf("no server at %s", addrB)
	}
	for _, name := range []string{nameA, nameB} { // connections, scripts
		if err := acquire(t, l, name, fence.TTL(time.Minute)).Release(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	rc.refuse(addrB)
	const nB = 40 // more than are sent at a time
	for range nB {
		if _, err := l.Acquire(ctx(t), nameB, fence.TTL(time.Minute)); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("Acquire on the refusing node: %v", err)
		}
	}
	resume := serverB.Pause(t)
	rc.r.set(addrB, false)
	// B's probe hangs (each round, for up to probeFor).
	waitFor(t, probing)
	rc.refuse(addrA)
	if _, err := l.Acquire(ctx(t), nameA, fence.TTL(time.Minute)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Acquire on the refusing node: %v", err)
	}
	rc.r.set(addrA, false)
	markA := lockKey(nameA) + ":revoked:*"
	nodeA := redis.NewClient(&redis.Options{Addr: addrA})
	defer nodeA.Close()
	took, ok := holdsWithin(5*time.Second, func() bool { return len(nodeA.Keys(ctx(t), markA).Val()) > 0 })
	if !ok {
		resume()
		t.Fatalf("the give-back for a lock on the node that answers again not sent after %v: it waits for the give-backs of a hung node", took)
	}
	t.Logf("A's give-back sent %v after A answered", took)
	resume()
	waitFor(t, parkingIdle)
}

// refusingCluster is a cluster of 3 masters and a Locker on a client of it
// whose dials to a node are refused while r says so.
type refusingCluster struct {
	*redistest.Cluster
	t     testing.TB
	l     *redislock.Locker
	r     *refuser
	admin *redis.ClusterClient
}

// startRefusingCluster starts one; readTimeout 0 is go-redis's default.
func startRefusingCluster(t testing.TB, readTimeout time.Duration) *refusingCluster {
	rc := &refusingCluster{Cluster: redistest.StartCluster(t, 3), t: t, r: &refuser{refused: map[string]bool{}}}
	rc.admin = redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs()})
	t.Cleanup(func() { _ = rc.admin.Close() })
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs(), Dialer: rc.r.dial, DialerRetries: 1, MaxRetries: 1, ReadTimeout: readTimeout})
	t.Cleanup(func() { _ = c.Close() })
	rc.l = lockerWith(t, c, redislock.Options{ReplicaSync: redislock.ReplicaSync{Disabled: true}})
	return rc
}

// nodeOf is the address of the master of name's lock.
func (rc *refusingCluster) nodeOf(name string) string {
	n, err := rc.admin.MasterForKey(ctx(rc.t), lockKey(name))
	if err != nil {
		rc.t.Fatal(err)
	}
	return n.Options().Addr
}

// refuse refuses dials to addr and drops the Locker's pooled connections
// to it, so that every call to it dials, and is refused.
func (rc *refusingCluster) refuse(addr string) {
	rc.r.set(addr, true)
	n := redis.NewClient(&redis.Options{Addr: addr})
	defer n.Close()
	if err := n.ClientKillByFilter(ctx(rc.t), "TYPE", "normal").Err(); err != nil {
		rc.t.Fatal(err)
	}
}
