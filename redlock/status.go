package redlock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/redis/go-redis/v9"
)

// NodeStatus is what one node holds for one lock name.
type NodeStatus struct {
	Addr      string        // the node's address, when its client tells it
	Held      bool          // the lock is held on this node
	TTL       time.Duration // the holder's remaining lease on this node; negative if held without expiry
	LastToken fence.Token   // the last token this node issued or was told of; 0 if none
	Err       error         // the node could not be read; the other fields are zero. A node that did not answer in time gives a net.Error whose Timeout is true
}

// Status reads the state of the lock called name on every node, in
// parallel, each within DefaultStatusTimeout (5 s) or ctx's deadline,
// whichever comes first: not within the node timeout, an acquisition's
// budget, which would report a slow but healthy node (a first dial over
// TLS, a loaded host) as unreachable. It changes nothing. The lock is held
// when it is held on a majority.
//
// Each node is read on its primary, by a script (EVAL) that go-redis sends
// there even on a node client that routes read-only commands to replicas
// (a cluster client over a primary and its replicas, as
// redis.NewFailoverClusterClient builds one, with ReadOnly or
// RouteRandomly): a replica may be behind its primary, and would call the
// lock free. On a node whose client sends every command to a replica
// (FailoverOptions.ReplicaOnly) the node's Err is READONLY, unless the ACL
// user may not run INFO, which the script asks the role with: then it reads
// the replica's copy. A primary that refuses or pauses writes
// (min-replicas-to-write, a failed save, CLIENT PAUSE WRITE) still answers
// it.
func (l *Locker) Status(ctx context.Context, name string) ([]NodeStatus, error) {
	if ctx == nil {
		return nil, nilctx.Err("redlock", "Status")
	}
	if err := l.made(); err != nil {
		return nil, err
	}
	if err := fence.ValidateName(name); err != nil {
		return nil, err
	}
	k := l.keys(name)
	rs := l.fanout(ctx, l.all(), DefaultStatusTimeout, func(ctx context.Context, i int) ([]int64, error) {
		// By Do, not Eval: a go-redis AutoPipeliner sends Eval in its
		// next batch, which waits for the one in flight, whose writes a
		// write pause holds; Do goes on a connection of its own
		// (TestStatusDuringWritePauseAutoPipeliner). Other clients route
		// Do by its key as they route Eval.
		state, err := l.nodes[i].Do(ctx, "EVAL", stateSrc, 2, k.lock, k.token).Slice()
		if err != nil {
			return nil, err
		}
		var pttl, token int64
		var ok bool
		if len(state) == 2 {
			pttl, ok = state[0].(int64)
		}
		if !ok {
			return nil, fmt.Errorf("unexpected reply %v", state)
		}
		if v, found := state[1].(string); found {
			if token, err = strconv.ParseInt(v, 10, 64); err != nil {
				return nil, fmt.Errorf("bad token record %q", v)
			}
		} else if state[1] != nil {
			return nil, fmt.Errorf("unexpected reply %v", state)
		}
		return []int64{pttl, token}, nil
	})
	out := make([]NodeStatus, len(rs))
	for i, r := range rs {
		if o, ok := l.nodes[i].(interface{ Options() *redis.Options }); ok {
			out[i].Addr = o.Options().Addr
		}
		if r.err != nil {
			out[i].Err = r.err
			continue
		}
		switch pttl := r.res[0]; pttl {
		case -2: // no such key
		case -1:
			out[i].Held, out[i].TTL = true, -1
		default:
			out[i].Held, out[i].TTL = true, time.Duration(pttl)*time.Millisecond
		}
		out[i].LastToken = fence.Token(r.res[1])
	}
	return out, nil
}
