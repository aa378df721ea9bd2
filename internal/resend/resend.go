// Package resend tells when a go-redis client may have sent a command
// twice: go-redis sends a command again (MaxRetries) once its read timed
// out, and the first copy, delayed on the network or in a paused server's
// socket, may still run after the second. redislock and redlock release a
// lock whose acquisition took that long with a revocation mark, which
// refuses such a copy if it runs later.
package resend

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// After is how long a call on client must have taken for the client
// to have sent it again: go-redis sends a command again (MaxRetries) once
// its read timed out, and the first may still reach the server, delayed on
// the network, and run after the second. Zero when the client does not
// send again (MaxRetries -1), has no read timeout, or is of another kind.
// Half the read timeout: timers fire late, never early, and a try that
// only looks resent costs its lease a revocation mark.
func After(client redis.UniversalClient) time.Duration {
	rt, retries := ReadTimeout(client)
	if rt <= 0 || retries <= 0 {
		return 0
	}
	return rt / 2
}

// Through is After for a caller that sends its commands through client
// itself, not through a cluster's node client: a ClusterClient sends a
// command whose read timed out again on its own (ClusterClient.process,
// up to MaxRedirects times, 3 by default), whatever its MaxRetries (-1 by
// default, which only its node clients read).
func Through(client redis.UniversalClient) time.Duration {
	if c, ok := client.(interface{ Options() *redis.ClusterOptions }); ok {
		o := c.Options()
		if o.ReadTimeout > 0 && (o.MaxRetries > 0 || o.MaxRedirects > 0) {
			return o.ReadTimeout / 2
		}
		return 0
	}
	return After(client)
}

// ReadTimeout is how long client waits for a reply (0 or less: for ever,
// or a client of another kind), and how many times it sends a command
// again after a read timed out.
func ReadTimeout(client redis.UniversalClient) (rt time.Duration, retries int) {
	// By the options the client reports, not its type: a type of the
	// caller's that embeds a *redis.Client reads with its ReadTimeout too
	// (TestWrappedClientShortReadTimeout).
	switch c := client.(type) {
	case interface{ Options() *redis.Options }:
		o := c.Options()
		rt, retries = o.ReadTimeout, o.MaxRetries
	case interface{ Options() *redis.ClusterOptions }:
		o := c.Options()
		rt, retries = o.ReadTimeout, o.MaxRetries
	case interface{ Options() *redis.RingOptions }:
		// The Ring resends (Ring.process, MaxRetries); its shards read
		// with ReadTimeout as given, which go-redis leaves unset in the
		// Ring's options: 0 is a shard client's default, 5 s.
		o := c.Options()
		rt, retries = o.ReadTimeout, o.MaxRetries
		if rt == 0 {
			rt = 5 * time.Second
		}
	}
	return rt, retries
}
