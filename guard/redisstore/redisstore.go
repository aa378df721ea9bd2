// Package redisstore keeps guard's accepted tokens in Redis. It is a package
// of its own so that users of guard's SQL and HTTP parts do not import
// go-redis.
//
// Store is a guard.Acceptor, not a guard.Store: Redis cannot hold the token
// check until the handler's writes elsewhere are done, so it serves as a
// gate only (see guard.Gate). Where the protected state lives in Redis
// itself, compare the token in the same script that writes the state.
//
// The last accepted tokens are plain keys without expiry. By default they
// have no clock floor, unlike redislock's own token record: a Redis that
// loses them (restarted without persistence, FLUSHDB, failed over to a
// replica that had not received them, evicting keys under maxmemory with
// an allkeys policy, an operator's DEL) accepts the next token of each
// resource, stale or not (each tested).
//
// Where the tokens are clock-floored (redislock's, redlock's), set
// Store.ClockTokens: the store then keeps a floor, the Redis server's
// clock when its state began, lost together with the records, and a
// resource with no record accepts only tokens above it, so a restart
// without persistence or a FLUSHDB refuses every token issued before it
// (guard.ErrStoreLost); it refuses Accepts that find no record under an
// allkeys-* maxmemory-policy (ErrAllKeysEviction). Set Store.Replicas so
// that a token the replicas did not acknowledge is refused
// (fence.ErrNotReplicated) rather than lost by a failover.
//
// The requirements, then: with ClockTokens, lock servers whose clocks do
// not run ahead of this Redis's by more than FloorMargin (2 s by default),
// and either no persistence at all or an append-only file with appendfsync
// always (an RDB snapshot, or appendfsync everysec, brings back the old
// floor with records older than the last accepted tokens: not seen, and
// tested); without it, the append-only file with appendfsync always. In
// both cases
// maxmemory-policy noeviction or a volatile one (the records have no
// expiry, so these never evict them); Replicas set wherever a replica may
// be promoted, or failover only to a replica known to have every write;
// and no DEL of keys under Prefix while an older holder may still write
// (a DEL of one record leaves the floor in place, and is not seen). Not on
// a Redis Cluster with ClockTokens (see Store.ClockTokens).
package redisstore

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/bound"
	"github.com/fencekit/fence/internal/nilctx"
	"github.com/fencekit/fence/internal/rediscluster"
	"github.com/fencekit/fence/internal/redisconn"
	"github.com/redis/go-redis/v9"
)

//go:embed accept.lua
var acceptSrc string
var acceptScript = redis.NewScript(acceptSrc)

//go:embed unconfirm.lua
var unconfirmSrc string
var unconfirmScript = redis.NewScript(unconfirmSrc)

// Store keeps the last accepted token of each resource in Redis, one key
// per resource under Prefix (default "fence:guard"), compared and set by one
// script. Beside it, for ResendWindow after each accepted token, a second
// key holds the id of the Accept call that sent it, so that the call's
// script sent again by the client (go-redis resends a command whose reply
// was lost, MaxRetries times by default) is found accepted, not stale;
// a different call with the same token is stale. It also holds the
// caller's call id (guard.WithCall: Gate passes the request's Fence-Call),
// so that another Accept of that call with that token (an HTTP resend of
// a request that was admitted) returns a *guard.ReplayedError, not stale
// and not accepted again; a call refused for too few replica
// acknowledgements is marked so, and its resend refused again (see
// Replicas).
//
// A *redis.Ring, or a wrapper embedding one, is refused
// (fence.ErrInvalidOption): each Ring client
// decides from its own heartbeats that a shard is down and hashes its keys
// to another shard, where the resource has no record, and the next token
// was accepted, stale or not, after a pause of under a second (tested).
//
// The zero value of every field but Client is the default: no floor, no
// replica sync.
type Store struct {
	Client redis.Scripter // a *redis.Client, *redis.ClusterClient, a Sentinel failover client; not a *redis.Ring
	Prefix string         // key prefix; empty means "fence:guard"

	// ClockTokens declares that every token the store is given is
	// clock-floored: never below the clock, in µs since the Unix epoch, of
	// the server that issued it at the moment it issued it. redislock's
	// tokens are (max(last + 1, the lock Redis's TIME in µs)), and so are
	// redlock's (the largest of its nodes' tokens, each at least that
	// node's TIME in µs). etcdlock's (revisions), zklock's (zxids),
	// pglock's and memlock's (counters), and any counter of your own, are
	// not: with them ClockTokens refuses every token of a new resource.
	//
	// With it set, the store keeps one floor key, Prefix+":floor", without
	// expiry: the Redis server's TIME in µs, plus FloorMargin, at the
	// moment the store's state began (the first Accept that found no
	// record and no floor creates it). A resource with no record accepts
	// a token only if it is greater than the floor; otherwise Accept
	// returns a *guard.StoreLostError (matching guard.ErrStoreLost, and
	// guard.ErrStale) and records nothing. A Redis that lost its state
	// (restarted without persistence, FLUSHDB or FLUSHALL, a DEL of the
	// whole Prefix) lost the floor with the records; the floor is made
	// again at that moment, so every token issued before the loss is
	// refused, while holders that acquire again get tokens above it. In
	// normal operation the floor is old and a new resource's first token
	// is accepted at once; only the tokens issued before the floor was
	// made (the store's first use, FloorMargin after it included) are
	// refused, once: their holders acquire again.
	//
	// It is sound while the clocks of the servers that issue the tokens
	// run ahead of the store's Redis's clock by less than FloorMargin, and
	// tokens are not issued more than FloorMargin ahead of their server's
	// clock (redislock's are not, but for bursts of more than one per µs;
	// redlock's are up to 2 s ahead): a token issued before the loss is
	// then below the floor. A lock server whose clock lags the store's
	// costs only availability: its holders' tokens are refused until its
	// clock passes the floor.
	//
	// What it does not cover: a restart that loads a partial state (an
	// RDB snapshot, an append-only file with appendfsync everysec), which
	// brings back the old floor with older records; a record deleted by
	// itself (an operator's DEL of one key: the floor stays old and the
	// next token is accepted); a failover to a replica that had the floor
	// but not the latest records (see Replicas). Eviction of records
	// under an allkeys-* maxmemory-policy it refuses instead: each Accept
	// that finds no record reads INFO memory in its script (one more
	// command on that path only) and, under allkeys-*, returns an error
	// matching ErrAllKeysEviction and records nothing. Records have no
	// expiry, so volatile-* policies and noeviction never evict them. The
	// store's user must be allowed INFO (an ACL user with -@dangerous is
	// not): where it is refused, such an Accept returns an error matching
	// fence.ErrInvalidOption and records nothing.
	//
	// Every Store on one Prefix must set ClockTokens alike: after a loss,
	// a Store without it records tokens without the floor, and a Store
	// with it then finds a record and accepts a token issued before the
	// loss (TestRedisStoreMixedClockTokens).
	//
	// The floor key lives in another hash slot than the records: on a
	// Redis Cluster every Accept with ClockTokens fails (CROSSSLOT), so
	// it is refused on a *redis.ClusterClient (or a wrapper embedding
	// one) with fence.ErrInvalidOption, unless the client was given its
	// slots (ClusterOptions.ClusterSlots, as go-redis's
	// NewFailoverClusterClient, a Sentinel client, is): its servers are
	// not in cluster mode; if they are (a cluster behind NAT), the
	// server's CROSSSLOT refusal matches fence.ErrInvalidOption.
	ClockTokens bool

	// MaxAhead, with ClockTokens, refuses a token that would be recorded
	// (greater than the resource's last) when it is above the store's
	// Redis clock, in µs, plus MaxAhead: with an error matching
	// guard.ErrInvalidToken, recording nothing. One forged token (the
	// int64 maximum, say) would otherwise block the resource for good,
	// every real token stale after it; guard.Gate checks the same on its
	// own clock (HTTPOptions.MaxAhead), a direct caller of Accept did not.
	// A lock server whose clock runs ahead of the store's by more than
	// MaxAhead has its tokens refused. Zero means guard.DefaultMaxAhead
	// (one hour); negative turns the check off. Without ClockTokens it is
	// not used (tokens need not be µs of a clock).
	MaxAhead time.Duration

	// FloorMargin is added to the Redis server's TIME when the floor is
	// made (see ClockTokens): how far ahead of the store's Redis clock a
	// token issued before the loss may be. Zero means DefaultFloorMargin;
	// a negative one is refused with fence.ErrInvalidOption. After a
	// loss, holders that acquire again are refused for this long.
	FloorMargin time.Duration

	// Replicas is how many replicas must acknowledge an accepted token:
	// after the script, on the same connection and in the same round
	// trip, WAIT Replicas ReplicaTimeout. When fewer acknowledge in time,
	// Accept returns a *fence.NotReplicatedError (matching
	// fence.ErrNotReplicated): the token was recorded on the primary,
	// but a failover to a replica without it would accept an older
	// token. The caller must treat the token as refused: not write, and
	// acquire a new lease before trying again (the token counts as spent
	// on the primary; Gate answers 503, ProblemNotReplicated). With a call
	// id (guard.WithCall), the script has recorded it with the token
	// before WAIT's answer; Accept then sends one more script, owner-checked
	// (only if the record is still this Accept's), that marks the call
	// refused, so that another Accept of that call with that token (Gate's
	// resend) returns an error matching fence.ErrNotReplicated (503 again),
	// not a *guard.ReplayedError: the call never ran, and the token stays
	// spent. Where the mark was not made or was lost (the script failed,
	// ctx ended first, another Accept replaced the record, or a failover
	// promoted a replica that received the record but not the mark), the
	// resend is found replayed (Gate: 409 ProblemAdmitted): false, but
	// nothing runs; the refusal's error says so when Accept knows it. The
	// same mark follows a WAIT that failed after the script was sent (its
	// answer later than the client's read timeout, say). A
	// Redis
	// that could not be reached (no connection at the last try) gives
	// the connection's error instead, as without Replicas; the token may
	// still count as spent. A replica
	// that was cut off, or lags by more than ReplicaTimeout, cannot have
	// acknowledged. Zero turns the check off; negative is refused with
	// fence.ErrInvalidOption. The client must be one that pipelines on one
	// connection (a *redis.Client, a Sentinel failover client, a
	// *redis.Conn, a *redis.ClusterClient, whose node for the resource's
	// key is used, following MOVED and ASK when the slot moves); a client
	// of another type, a wrapper embedding one of
	// these included (a wrapped cluster client's pipeline sends WAIT to any
	// master), is refused with fence.ErrInvalidOption. WAIT
	// is not consensus: with Replicas 1 and two replicas, the other one
	// may be promoted.
	Replicas int

	// ReplicaTimeout bounds WAIT (see Replicas); zero means
	// DefaultReplicaTimeout (1 s). Redis answers WAIT up to a clock tick
	// (100 ms at the default hz 10) after it: on a *redis.Client whose
	// ReadTimeout is not above ReplicaTimeout + 100 ms, Accept refuses
	// with fence.ErrInvalidOption. Negative is refused likewise. On a
	// server run with a lower hz (1: a second a tick) WAIT's answer may
	// come after the client's ReadTimeout: Accept is then refused
	// (fence.ErrNotReplicated) only after go-redis has sent the script and
	// WAIT again MaxRetries times (6 s measured for a ReplicaTimeout of
	// 1 s and a ReadTimeout of 1.3 s), unless ctx ends first.
	ReplicaTimeout time.Duration
}

// Defaults of Store's fields.
const (
	DefaultFloorMargin    = 2 * time.Second // covers redlock's tokens, up to 2 s ahead of its nodes' clocks
	DefaultReplicaTimeout = time.Second     // Redisson's slavesSyncTimeout, as redislock's
)

// ErrAllKeysEviction means a Store with ClockTokens found no record of a
// resource on a Redis whose maxmemory-policy is an allkeys one: a record
// evicted there cannot be told from a new resource while the floor stays,
// so the token was refused and nothing recorded. Use noeviction or a
// volatile-* policy.
var ErrAllKeysEviction = errors.New("redisstore: maxmemory-policy evicts keys without expiry")

var _ guard.Acceptor = Store{}

// ResendWindow is how long a Store recognises a resend of an Accept call
// that was accepted. A resend later than that (or after Redis evicted the
// key that records the call, as volatile policies may) is found stale:
// refused, never accepted twice.
// The same holds for a caller's call id (see guard.WithCall).
const ResendWindow = 10 * time.Minute

// Accept records token for resource if it is greater than the last one
// accepted and returns nil; otherwise it returns a *guard.StaleError
// (matching guard.ErrStale) and records nothing. If ctx carries a call id
// (guard.WithCall) and the token was accepted with that id, within
// ResendWindow, it returns a *guard.ReplayedError (matching
// guard.ErrReplayed): the call was admitted before, and must not be run
// again. An invalid call id gives an error matching guard.ErrInvalidCall, a
// resource that is not a valid lock name (fence.ValidateName) one matching
// guard.ErrInvalidResource, a token of zero or less one matching
// guard.ErrInvalidToken, a Store without a Client (nil, or a nil pointer)
// or with a *redis.Ring one matching fence.ErrInvalidOption; none reaches
// Redis. A client that panics (a wrapper embedding a nil *redis.Client)
// gives an error matching fence.ErrInvalidOption, never a panic.
//
// Accept returns by the end of ctx whatever the client's options (go-redis
// honours a context's deadline only with ContextTimeoutEnabled, and never a
// cancellation): the script then goes on running on a goroutine of its own
// until the client gives up or the server answers, and may still record the
// token. Accept's error then matches ctx's, and the token counts as spent.
func (s Store) Accept(ctx context.Context, resource string, token fence.Token) error {
	if ctx == nil {
		return nilctx.Err("redisstore", "Accept")
	}
	if s.Client == nil {
		return fmt.Errorf("%w: redisstore: Store has no Client", fence.ErrInvalidOption)
	}
	if v := reflect.ValueOf(s.Client); v.Kind() == reflect.Pointer && v.IsNil() {
		// A nil *redis.Client: it would panic on the goroutine that
		// bounds the call (see bounded), out of any recover's reach.
		return fmt.Errorf("%w: redisstore: Store's Client is a nil %T", fence.ErrInvalidOption, s.Client)
	}
	base := underlying(s.Client) // once: reflection for a wrapper
	if _, ok := base.(*redis.Ring); ok {
		// A Ring that marks a shard down (its own heartbeats, a blip) hashes
		// the resource to another shard, without the record.
		return fmt.Errorf("%w: redisstore: Store on a *redis.Ring: a shard marked down moves the resource to another shard without its last token; pass a shard's own client, a Cluster or a Sentinel client", fence.ErrInvalidOption)
	}
	if err := fence.ValidateName(resource); err != nil {
		return fmt.Errorf("%w: %w", guard.ErrInvalidResource, err)
	}
	if token <= 0 {
		return fmt.Errorf("%w: %d must be greater than zero", guard.ErrInvalidToken, token)
	}
	call := guard.CallFrom(ctx)
	if err := guard.CheckCall(call); err != nil {
		return err
	}
	prefix := s.Prefix
	if prefix == "" {
		prefix = "fence:guard"
	}
	if err := s.checkOptions(base); err != nil {
		return err
	}
	key := prefix + ":{" + resource + "}"
	keys := []string{key, key + ":call"}
	margin, ahead := int64(0), int64(0)
	if s.ClockTokens {
		keys = append(keys, prefix+":floor")
		margin = s.FloorMargin.Microseconds()
		if s.FloorMargin == 0 {
			margin = DefaultFloorMargin.Microseconds()
		}
		switch {
		case s.MaxAhead == 0:
			ahead = guard.DefaultMaxAhead.Microseconds()
		case s.MaxAhead > 0:
			ahead = max(s.MaxAhead.Microseconds(), 1)
		}
	}
	var id [16]byte
	_, _ = rand.Read(id[:]) // never fails (crypto/rand)
	args := []any{strconv.FormatInt(int64(token), 10), hex.EncodeToString(id[:]), ResendWindow.Milliseconds(), call, margin, ahead}
	res, err := bounded(ctx, func() (res result, err error) {
		// A client that panics (a wrapper around a nil *redis.Client, a
		// hook's bug) would do so on bound's goroutine, out of the
		// caller's recover's reach: the process would die.
		defer func() {
			if r := recover(); r != nil {
				res, err = result{}, fmt.Errorf("%w: redisstore: the client (%T) panicked: %v", fence.ErrInvalidOption, s.Client, r)
			}
		}()
		if s.Replicas > 0 {
			res, err := s.evalSynced(ctx, key, keys, args)
			var werr *waitError
			if call != "" && (err == nil && res.last == "" && res.acked < s.Replicas || errors.As(err, &werr)) {
				// Refused for too few acknowledgements (or WAIT failed),
				// but the script recorded the call (or may have): mark it
				// refused, so that its resend is not answered as admitted
				// (it never ran). The mark is owner-checked: a script that
				// did not run leaves nothing to mark. If this fails, the
				// resend is answered admitted: false, but safe.
				var n int
				n, res.unconfirmErr = unconfirmScript.Run(ctx, s.Client, keys[:2], args[0], args[1], call).Int()
				res.unconfirmed = res.unconfirmErr == nil && n == 1
			}
			return res, err
		}
		last, err := acceptScript.Run(ctx, s.Client, keys, args...).Text()
		return result{last: last}, err
	})
	if err != nil {
		if redis.HasErrorPrefix(err, "CROSSSLOT") {
			// ClockTokens on a real cluster behind a client given its
			// slots (see ClockTokens): the server refused the script.
			return fmt.Errorf("%w: redisstore: accept %q: ClockTokens on a Redis Cluster (the floor key is in another hash slot than the records): %w", fence.ErrInvalidOption, resource, err)
		}
		return fmt.Errorf("redisstore: accept %q: %w", resource, err)
	}
	last := res.last
	switch {
	case last == "":
		if s.Replicas > 0 && res.acked < s.Replicas {
			nr := &fence.NotReplicatedError{Acked: res.acked, Required: s.Replicas}
			switch {
			case call == "" || res.unconfirmed:
				return fmt.Errorf("redisstore: accept %q: token %d recorded on the primary only: %w", resource, token, nr)
			case res.unconfirmErr != nil:
				return fmt.Errorf("redisstore: accept %q: token %d recorded on the primary only, and call %s could not be marked refused (a resend of it will be answered as admitted): %v: %w",
					resource, token, call, res.unconfirmErr, nr)
			}
			return fmt.Errorf("redisstore: accept %q: token %d recorded on the primary only, and call %s could not be marked refused (its record was gone or replaced): %w",
				resource, token, call, nr)
		}
		return nil
	case last == "replayed":
		return &guard.ReplayedError{Resource: resource, Token: token, Call: call}
	case last == "unconfirmed":
		// A resend of a call refused for too few acknowledgements: it
		// never ran, and its token stays spent.
		return fmt.Errorf("redisstore: accept %q: token %d with call %s was refused before (too few replicas acknowledged it) and did not run; the token stays spent: %w",
			resource, token, call, fence.ErrNotReplicated)
	case strings.HasPrefix(last, "allkeys "):
		return fmt.Errorf("%w: redisstore: accept %q: no record, and maxmemory-policy is %s, under which a record may have been evicted; use noeviction or a volatile-* policy",
			ErrAllKeysEviction, resource, strings.TrimPrefix(last, "allkeys "))
	case strings.HasPrefix(last, "noinfo "):
		return fmt.Errorf("%w: redisstore: accept %q: ClockTokens reads INFO memory (the eviction policy) when a resource has no record, and the server refused it to the store's user: %s",
			fence.ErrInvalidOption, resource, strings.TrimPrefix(last, "noinfo "))
	case strings.HasPrefix(last, "ahead "):
		return fmt.Errorf("%w: redisstore: accept %q: token %d is above the store's Redis clock plus MaxAhead (%s µs): forged, or from a server whose clock runs far ahead; nothing recorded",
			guard.ErrInvalidToken, resource, token, strings.TrimPrefix(last, "ahead "))
	case strings.HasPrefix(last, "floor "):
		n, err := strconv.ParseInt(strings.TrimPrefix(last, "floor "), 10, 64)
		if err != nil {
			return fmt.Errorf("redisstore: accept %q: bad floor %q", resource, last)
		}
		return &guard.StoreLostError{Resource: resource, Token: token, Floor: fence.Token(n)}
	}
	n, err := strconv.ParseInt(last, 10, 64)
	if err != nil {
		return fmt.Errorf("redisstore: accept %q: bad stored token %q", resource, last)
	}
	return &guard.StaleError{Resource: resource, Token: token, Last: fence.Token(n)}
}

// result is the accept script's reply and, with Replicas, WAIT's.
type result struct {
	last  string
	acked int

	// With a call id, after too few acknowledgements: whether the call's
	// record was marked refused (unconfirm.lua), or why that failed.
	unconfirmed  bool
	unconfirmErr error
}

// checkOptions refuses fields out of range, and combinations with the
// client that cannot work, before anything reaches Redis. base is
// underlying(s.Client).
func (s Store) checkOptions(base redis.Scripter) error {
	if s.FloorMargin < 0 {
		return fmt.Errorf("%w: redisstore: FloorMargin %v is negative", fence.ErrInvalidOption, s.FloorMargin)
	}
	if s.Replicas < 0 {
		return fmt.Errorf("%w: redisstore: Replicas %d is negative", fence.ErrInvalidOption, s.Replicas)
	}
	if s.ReplicaTimeout < 0 {
		return fmt.Errorf("%w: redisstore: ReplicaTimeout %v is negative", fence.ErrInvalidOption, s.ReplicaTimeout)
	}
	// A ClusterClient given its slots (ClusterSlots: go-redis's
	// NewFailoverClusterClient over a Sentinel primary, or servers not in
	// cluster mode) runs the script on one server that checks no slots.
	if cc, ok := base.(*redis.ClusterClient); s.ClockTokens && ok && cc.Options().ClusterSlots == nil {
		return fmt.Errorf("%w: redisstore: ClockTokens on a *redis.ClusterClient: the floor key is in another hash slot than the records, so the script could not run", fence.ErrInvalidOption)
	}
	if s.Replicas == 0 {
		return nil
	}
	switch s.Client.(type) {
	case *redis.Client, *redis.Conn, *redis.ClusterClient:
	default:
		// Not any pipeliner: a wrapper embedding a *redis.ClusterClient
		// has Pipeline too, and its pipeline sends the key-less WAIT to
		// any master, which confirms at once what its replicas never saw.
		return fmt.Errorf("%w: redisstore: Replicas on a %T: WAIT must follow the script on its connection, and only a *redis.Client, *redis.Conn or *redis.ClusterClient is known to send it there; pass the client itself, not a wrapper", fence.ErrInvalidOption, s.Client)
	}
	if c, ok := s.Client.(*redis.Client); ok {
		if rt := c.Options().ReadTimeout; rt > 0 && rt <= s.replicaTimeout()+100*time.Millisecond {
			return fmt.Errorf("%w: redisstore: ReplicaTimeout %v does not fit in the client's ReadTimeout %v (Redis answers WAIT up to 100 ms after its timeout)", fence.ErrInvalidOption, s.replicaTimeout(), rt)
		}
	}
	return nil
}

// underlying returns the go-redis client that c wraps: a tracing or
// metrics wrapper embeds it (a *redis.Ring, say, or a
// redis.UniversalClient holding one), and Store's refusals are about the
// client underneath. It follows embedded fields, a few levels deep, and
// returns c itself when it embeds no redis.Scripter.
func underlying(c redis.Scripter) redis.Scripter {
	for range 8 {
		switch c.(type) {
		case *redis.Client, *redis.ClusterClient, *redis.Ring, *redis.Conn:
			return c
		}
		v := reflect.ValueOf(c)
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return c
			}
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			return c
		}
		// No == on c: a wrapper struct with a slice or map field is not
		// comparable, and comparing it would panic.
		var next redis.Scripter
		for i := range v.NumField() {
			f := v.Field(i)
			if !v.Type().Field(i).Anonymous || !f.CanInterface() {
				continue
			}
			if (f.Kind() == reflect.Interface || f.Kind() == reflect.Pointer) && f.IsNil() {
				continue
			}
			if inner, ok := f.Interface().(redis.Scripter); ok {
				next = inner
				break
			}
		}
		if next == nil {
			return c
		}
		c = next
	}
	return c
}

func (s Store) replicaTimeout() time.Duration {
	if s.ReplicaTimeout == 0 {
		return DefaultReplicaTimeout
	}
	return s.ReplicaTimeout
}

type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// evalSynced runs the accept script (by SHA, again in full on NOSCRIPT)
// followed by WAIT in one pipeline: one connection, one round trip, since
// WAIT counts only its own connection's writes. On a cluster the pipeline
// goes to the node that owns key (a cluster pipeline would send the
// key-less WAIT anywhere), and follows MOVED (reloading the client's slot
// map, which never sees these replies) and ASK (ASKING first, in the same
// pipeline), up to maxRedirects in a row.
func (s Store) evalSynced(ctx context.Context, key string, keys []string, args []any) (result, error) {
	var c pipeliner
	cc, cluster := s.Client.(*redis.ClusterClient)
	if cluster {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return result{}, err
		}
		c = node
	} else {
		c = s.Client.(pipeliner) // checked by checkOptions
	}
	sent := time.Now()
	full := s.replicaTimeout()
	timeout := full
	load, asking := false, false
	for redirects := 0; ; {
		pipe := c.Pipeline()
		if asking {
			pipe.Do(ctx, "ASKING")
		}
		var reply *redis.Cmd
		if load {
			reply = pipe.Eval(ctx, acceptSrc, keys, args...)
		} else {
			reply = pipe.EvalSha(ctx, acceptScript.Hash(), keys, args...)
		}
		wait := pipe.Do(ctx, "WAIT", s.Replicas, max(timeout.Milliseconds(), 1))
		_, _ = pipe.Exec(ctx)
		last, err := reply.Text()
		// left is what the next try's WAIT gets: the WAIT sent with a
		// script that did not run waited out the timeout if too few
		// replicas answered (see redisconn.WaitLeft).
		left := func() time.Duration {
			acked, werr := wait.Int()
			if werr != nil {
				acked = -1
			}
			return redisconn.WaitLeft(full, sent, acked, s.Replicas)
		}
		if !load && err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			timeout, load = left(), true
			continue
		}
		if cluster && err != nil && redirects < maxRedirects {
			moved, isMoved := redis.IsMovedError(err)
			ask, isAsk := redis.IsAskError(err)
			if isMoved || isAsk {
				addr := ask
				if isMoved {
					cc.ReloadState(ctx)
					addr = moved
				}
				node, nerr := rediscluster.MasterByAddr(ctx, cc, addr)
				if nerr != nil {
					return result{}, fmt.Errorf("redisstore: %w (after %w)", nerr, err)
				}
				c, asking, timeout = node, isAsk, left()
				redirects++
				continue
			}
		}
		if err != nil && err != wait.Err() {
			return result{}, err // the script's own error
		}
		if err != nil && notSent(err) {
			// No connection (refused, pool timeout, client closed): this
			// try reached no server. (An earlier try that go-redis sent
			// again may have run the script; the error says only that
			// the token was not accepted, as any error does.)
			return result{}, err
		}
		acked, werr := wait.Int()
		if werr != nil {
			// The script may have run (its reply read, or not): nothing
			// confirms its write on any replica.
			return result{}, &waitError{err: werr, required: s.Replicas}
		}
		return result{last: last, acked: acked}, nil
	}
}

// maxRedirects bounds the MOVED and ASK replies evalSynced follows in a row.
const maxRedirects = 16

// notSent reports whether err means the pipeline never reached a server:
// a dial that failed, no connection from the pool, a closed client.
func notSent(err error) bool {
	var op *net.OpError
	return errors.Is(err, redis.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) ||
		(errors.As(err, &op) && op.Op == "dial")
}

// waitError is a WAIT that failed after the script was sent: the token may
// be recorded on the primary, and no replica confirmed it.
type waitError struct {
	err      error
	required int
}

func (e *waitError) Error() string {
	return "WAIT failed after the accept script was sent (the token may be recorded on the primary only): " + e.err.Error()
}

func (e *waitError) Unwrap() []error {
	return []error{&fence.NotReplicatedError{Required: e.required}, e.err}
}

// bounded returns call's result, or ctx's error (with its cause) as soon as
// ctx is done: a server that hangs would otherwise hold the call for the
// client's ReadTimeout (3 s by default), or for ever with none.
func bounded(ctx context.Context, call func() (result, error)) (result, error) {
	res, err := bound.Call(ctx, call, nil)
	if err != nil && err == ctx.Err() {
		if cause := context.Cause(ctx); cause != err {
			return result{}, fmt.Errorf("%w: %w", err, cause)
		}
	}
	return res, err
}
