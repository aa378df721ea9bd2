package redislock

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fencekit/fence"
	"github.com/redis/go-redis/v9"
)

// HiddenClusterError is the error, matching fence.ErrInvalidOption, of
// every acquisition and renewal of a Locker with replica sync on whose
// client is a UniversalClient of a type redislock cannot identify (a
// struct of the caller's that embeds the redis.UniversalClient interface,
// say, which has no Options method to tell what it holds) and whose
// server says it is a Redis Cluster node. Such a client may be a cluster
// client, which would send replica sync's key-less WAIT to a node of its
// own choosing, not on the connection that ran the script, where it counts
// nothing that connection wrote: acquisitions would be confirmed as
// replicated unchecked. Acquire wraps it in an error matching
// fence.ErrNotAcquired; nothing is taken, and a waiting Acquire ends at
// once. Pass the *redis.ClusterClient itself, or disable replica sync.
type HiddenClusterError struct {
	Client string // the client's type, as %T prints it
}

// Error says what was refused and what to pass instead.
func (e *HiddenClusterError) Error() string {
	return fmt.Sprintf("redislock: the client, a %s, is of a type redislock cannot identify, and its server is a Redis Cluster node: a cluster client would send replica sync's WAIT to a node of its choosing, not on the connection that ran the script; pass the *redis.ClusterClient itself, or disable replica sync", e.Client)
}

// Unwrap makes the error match fence.ErrInvalidOption.
func (e *HiddenClusterError) Unwrap() error { return fence.ErrInvalidOption }

// clusterProbe is what a Locker on an opaque client learnt from its server:
// whether it is a cluster node (refusal set) or not, once done.
type clusterProbe struct {
	mu      sync.Mutex // held while the server is asked: one probe at a time
	done    atomic.Bool
	refusal atomic.Pointer[HiddenClusterError]
}

// opaqueClient reports whether client is a UniversalClient of a type that
// redislock cannot tell for a single server's: not a *redis.Client (plain
// or Sentinel failover), nor a type embedding one (which reports its
// *redis.Options), nor a cluster client or a Ring (which the Locker routes
// by itself; New refuses types embedding them). A struct embedding the
// redis.UniversalClient interface is one, whatever it holds, and so is a
// go-redis AutoPipeliner (refused by New with replica sync on).
func opaqueClient(client redis.UniversalClient) bool {
	switch client.(type) {
	case nil, *redis.Client, *redis.ClusterClient, *redis.Ring, interface{ Options() *redis.Options }:
		return false
	}
	return true
}

// hiddenCluster returns, for a Locker on an opaque client, the
// *HiddenClusterError when the server is a cluster node, asking it (INFO
// cluster, one round trip) the first time only: the answer is kept, and
// later calls cost an atomic load. An error of the question itself (the
// server unreachable) is returned and not kept; the next call asks again.
// On any other client it returns nil at once.
//
// It must run before anything replica sync sends through the client: the
// replica record's script would run on the node that owns the record's
// key, not the lock's, and count that node's replicas.
func (l *Locker) hiddenCluster(ctx context.Context) error {
	if !l.opaque {
		return nil
	}
	p := &l.probe
	if !p.done.Load() {
		if err := l.probeCluster(ctx); err != nil {
			return err
		}
	}
	if e := p.refusal.Load(); e != nil {
		return e
	}
	return nil
}

// probeCluster asks the server whether it is a cluster node, unless
// another call has.
func (l *Locker) probeCluster(ctx context.Context) error {
	p := &l.probe
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done.Load() {
		return nil
	}
	// Key-less: a cluster client sends it to a node of its choosing (or
	// to every node), and every node of a cluster answers
	// cluster_enabled:1. INFO is what the replica record's script reads
	// anyway, so an ACL that allows replica sync allows it.
	info, err := l.client.Info(ctx, "cluster").Result()
	if err != nil {
		return fmt.Errorf("redislock: ask the server of a %T whether it is a cluster node (replica sync must know): %w", l.client, err)
	}
	if clusterEnabled(info) {
		p.refusal.Store(&HiddenClusterError{Client: fmt.Sprintf("%T", l.client)})
	}
	p.done.Store(true)
	return nil
}

// clusterEnabled reads cluster_enabled from INFO cluster (or from INFO
// replies of several nodes, as a cluster client may merge them).
func clusterEnabled(info string) bool {
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == "cluster_enabled" && v != "0" {
			return true
		}
	}
	return false
}
