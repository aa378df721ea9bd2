// Package redisstore keeps guard's accepted tokens in Redis. It is a package
// of its own so that users of guard's SQL and HTTP parts do not import
// go-redis.
//
// Store is a guard.Acceptor, not a guard.Store: Redis cannot hold the token
// check until the handler's writes elsewhere are done, so it serves as a
// gate only (see guard.Gate). Where the protected state lives in Redis
// itself, compare the token in the same script that writes the state.
//
// The last accepted tokens are plain keys, without expiry and without the
// clock floor of redislock's own token record: a Redis that loses them
// (restarted without persistence, failed over to a replica that had not
// received them, evicting keys under maxmemory with an allkeys policy, or
// an operator's DEL or FLUSHDB) accepts the next token of each resource,
// stale or not (each tested). Give it an append-only file with
// appendfsync always, and maxmemory-policy noeviction or a volatile one;
// fail over only to a replica known to have every write, and never
// delete the keys under Prefix while an older holder may still write.
package redisstore

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/guard"
	"github.com/fencekit/fence/internal/bound"
	"github.com/redis/go-redis/v9"
)

//go:embed accept.lua
var acceptSrc string
var acceptScript = redis.NewScript(acceptSrc)

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
// and not accepted again.
//
// A *redis.Ring is refused (fence.ErrInvalidOption): each Ring client
// decides from its own heartbeats that a shard is down and hashes its keys
// to another shard, where the resource has no record, and the next token
// was accepted, stale or not, after a pause of under a second (tested).
type Store struct {
	Client redis.Scripter // a *redis.Client, *redis.ClusterClient, a Sentinel failover client; not a *redis.Ring
	Prefix string         // key prefix; empty means "fence:guard"
}

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
// Redis.
//
// Accept returns by the end of ctx whatever the client's options (go-redis
// honours a context's deadline only with ContextTimeoutEnabled, and never a
// cancellation): the script then goes on running on a goroutine of its own
// until the client gives up or the server answers, and may still record the
// token. Accept's error then matches ctx's, and the token counts as spent.
func (s Store) Accept(ctx context.Context, resource string, token fence.Token) error {
	if s.Client == nil {
		return fmt.Errorf("%w: redisstore: Store has no Client", fence.ErrInvalidOption)
	}
	if v := reflect.ValueOf(s.Client); v.Kind() == reflect.Pointer && v.IsNil() {
		// A nil *redis.Client: it would panic on the goroutine that
		// bounds the call (see bounded), out of any recover's reach.
		return fmt.Errorf("%w: redisstore: Store's Client is a nil %T", fence.ErrInvalidOption, s.Client)
	}
	if _, ok := s.Client.(*redis.Ring); ok {
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
	key := prefix + ":{" + resource + "}"
	var id [16]byte
	_, _ = rand.Read(id[:]) // never fails (crypto/rand)
	last, err := bounded(ctx, func() (string, error) {
		return acceptScript.Run(ctx, s.Client, []string{key, key + ":call"},
			strconv.FormatInt(int64(token), 10), hex.EncodeToString(id[:]), ResendWindow.Milliseconds(), call).Text()
	})
	if err != nil {
		return fmt.Errorf("redisstore: accept %q: %w", resource, err)
	}
	switch last {
	case "":
		return nil
	case "replayed":
		return &guard.ReplayedError{Resource: resource, Token: token, Call: call}
	}
	n, err := strconv.ParseInt(last, 10, 64)
	if err != nil {
		return fmt.Errorf("redisstore: accept %q: bad stored token %q", resource, last)
	}
	return &guard.StaleError{Resource: resource, Token: token, Last: fence.Token(n)}
}

// bounded returns call's result, or ctx's error (with its cause) as soon as
// ctx is done: a server that hangs would otherwise hold the call for the
// client's ReadTimeout (3 s by default), or for ever with none.
func bounded(ctx context.Context, call func() (string, error)) (string, error) {
	last, err := bound.Call(ctx, call, nil)
	if err != nil && err == ctx.Err() {
		if cause := context.Cause(ctx); cause != err {
			return "", fmt.Errorf("%w: %w", err, cause)
		}
	}
	return last, err
}
