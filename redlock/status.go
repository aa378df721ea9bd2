package redlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fencekit/fence"
	"github.com/redis/go-redis/v9"
)

// NodeStatus is what one node holds for one lock name.
type NodeStatus struct {
	Addr      string        // the node's address, when its client tells it
	Held      bool          // the lock is held on this node
	TTL       time.Duration // the holder's remaining lease on this node; negative if held without expiry
	LastToken fence.Token   // the last token this node issued or was told of; 0 if none
	Err       error         // the node could not be read; the other fields are zero
}

// Status reads the state of the lock called name on every node, in
// parallel, each within DefaultStatusTimeout (5 s) or ctx's deadline,
// whichever comes first: not within the node timeout, an acquisition's
// budget, which would report a slow but healthy node (a first dial over
// TLS, a loaded host) as unreachable. It changes nothing. The lock is held
// when it is held on a majority.
func (l *Locker) Status(ctx context.Context, name string) ([]NodeStatus, error) {
	if err := l.made(); err != nil {
		return nil, err
	}
	if err := fence.ValidateName(name); err != nil {
		return nil, err
	}
	k := l.keys(name)
	rs := l.fanout(ctx, l.all(), DefaultStatusTimeout, func(ctx context.Context, i int) ([]int64, error) {
		pipe := l.nodes[i].Pipeline()
		pttl := pipe.PTTL(ctx, k.lock)
		last := pipe.Get(ctx, k.token)
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		var token int64
		if v, err := last.Result(); err == nil {
			if token, err = strconv.ParseInt(v, 10, 64); err != nil {
				return nil, fmt.Errorf("bad token record %q", v)
			}
		}
		return []int64{int64(pttl.Val()), token}, nil
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
		switch ttl := time.Duration(r.res[0]); {
		case ttl == -2: // no such key (go-redis passes -2 and -1 through unscaled)
		case ttl == -1:
			out[i].Held, out[i].TTL = true, -1
		default:
			out[i].Held, out[i].TTL = true, ttl
		}
		out[i].LastToken = fence.Token(r.res[1])
	}
	return out, nil
}
