// Package rediscluster holds what redislock and guard/redisstore both do
// with a go-redis cluster client when they follow a redirection
// themselves (their script and WAIT go to one node in one pipeline, which
// the cluster client's own routing would split).
package rediscluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ErrUnlisted is MasterByAddr's error for an address that no node of the
// cluster client's slot map has, even just reloaded: a node added to the
// cluster that the node answering CLUSTER SLOTS does not know of yet (the
// cluster bus has not told it). It passes once the nodes have gossiped.
var ErrUnlisted = errors.New("a node the cluster client's slot map does not list")

// MasterByAddr returns the cluster client's node client for addr, which a
// redirection (MOVED or ASK) named as the slot's master. The client's slot
// map may not list it as a master yet (just after a failover or a slot
// migration), so every node is searched, in the map ForEachShard reloads
// first. A node is addr also when the map lists it with an empty or
// unspecified host and addr's host is a loopback address, with the same
// port: a node that has not learned its own IP yet (no cluster bus packet
// received since it started, which a loaded machine delays) reports ""
// for itself in CLUSTER SLOTS, go-redis lists it as ":port" and dials the
// local host there, while the others redirect to it as "127.0.0.1:port".
// A node the map does not list at all is ErrUnlisted, at once: a caller
// that waits tries again later (looking again here, one reload per look
// and caller, made CLUSTER SLOTS calls pile up when many callers were
// redirected at once).
func MasterByAddr(ctx context.Context, cc *redis.ClusterClient, addr string) (*redis.Client, error) {
	var mu sync.Mutex
	var exact, local *redis.Client
	err := cc.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error {
		listed := c.Options().Addr
		mu.Lock()
		defer mu.Unlock()
		switch {
		case listed == addr:
			exact = c
		case sameLocal(listed, addr):
			local = c
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	switch {
	case exact != nil:
		return exact, nil
	case local != nil:
		return local, nil
	}
	return nil, fmt.Errorf("redirected to %s, %w", addr, ErrUnlisted)
}

// sameLocal reports whether listed, an address with no host or an
// unspecified one (which Go dials on the local host), and redirect, a
// loopback address, name the same port.
func sameLocal(listed, redirect string) bool {
	lh, lp, err := net.SplitHostPort(listed)
	if err != nil {
		return false
	}
	rh, rp, err := net.SplitHostPort(redirect)
	if err != nil || lp != rp {
		return false
	}
	rip := net.ParseIP(rh)
	if rip == nil || !rip.IsLoopback() {
		return false
	}
	if lh == "" {
		return true
	}
	lip := net.ParseIP(lh)
	return lip != nil && lip.IsUnspecified()
}
